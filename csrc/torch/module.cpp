// shoal._C: the Python face of the torch backend. Built against the installed torch (its
// bundled pybind11, so that torch's c10d types are shared with torch._C).
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/utils/pybind.h>

#include "backend.h"
#include "shoal/doctor.h"

namespace py = pybind11;
using shoal_torch::BackendShoal;

namespace {

c10::intrusive_ptr<BackendShoal::Options> copy_options(const py::object& obj) {
  auto o = c10::make_intrusive<BackendShoal::Options>();
  if (obj.is_none()) return o;
  auto given = obj.cast<c10::intrusive_ptr<BackendShoal::Options>>();
  o->timeout = given->timeout;
  o->transport = given->transport;
  o->tcp_streams = given->tcp_streams;
  o->front = given->front;
  return o;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "shoal's torch.distributed backend (C++)";
  // torch.distributed registers c10d's types (Backend, Store, Work, ...) with pybind11.
  py::module_::import("torch.distributed");

  auto cls = py::class_<BackendShoal, c10d::Backend, c10::intrusive_ptr<BackendShoal>>(m, "BackendShoal", R"(
A torch.distributed backend over one shoal communicator. Created by torch.distributed through
the creator registered by ``import shoal``; constructing it directly is collective over the group.)");

  py::class_<BackendShoal::Options, c10d::Backend::Options, c10::intrusive_ptr<BackendShoal::Options>>(cls, "Options", R"(
Options of the shoal backend; pass as ``init_process_group("shoal", pg_options=...)`` or
``new_group(..., pg_options=...)``. The process group's timeout overrides ``_timeout``.)")
      .def(py::init([](std::chrono::milliseconds timeout) { return c10::make_intrusive<BackendShoal::Options>(timeout); }),
           py::arg("timeout") = kBackendDefaultTimeout)
      .def_readwrite("transport", &BackendShoal::Options::transport,
                     "'auto', 'shm' or 'tcp' ('' = SHOAL_TRANSPORT or auto)")
      .def_readwrite("tcp_streams", &BackendShoal::Options::tcp_streams,
                     "TCP connections per peer (0 = SHOAL_TCP_STREAMS or the default)");

  cls.def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout,
                      const py::object& options, const std::string& group_name, const std::string& front) {
            auto o = copy_options(options);
            o->timeout = timeout;
            if (!group_name.empty()) o->group_name = group_name;
            if (front != "torch" && front != "ray") throw py::value_error("front must be 'torch' or 'ray'");
            o->front = front;
            py::gil_scoped_release nogil;
            return c10::make_intrusive<BackendShoal>(store, rank, size, o);
          }),
          py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout") = kBackendDefaultTimeout,
          py::arg("options") = py::none(), py::arg("group_name") = "", py::arg("front") = "torch")
      .def_property_readonly("options", &BackendShoal::getOptions)
      .def("transports", &BackendShoal::transports, "'self', 'shm' or 'tcp' for each rank of the group")
      .def("abort_because", &BackendShoal::abort_because, py::arg("why"), py::call_guard<py::gil_scoped_release>(),
           "Aborts the group: every peer's op fails at once, naming `why`.")
      .def("allreduce_inline", &BackendShoal::allreduce_inline, py::arg("tensor"), py::arg("op"),
           py::call_guard<py::gil_scoped_release>(),
           "All-reduce of a contiguous CPU tensor in place, returning when done (shoal.torch.all_reduce_); "
           "False, doing nothing, for another tensor.");

  // `python -m shoal doctor` (shoal/doctor.py): the C++ side of the report, and its formatting.
  using DoctorItem = std::tuple<std::string, std::string, std::string, bool>;
  m.def(
      "doctor_items",
      [](int ranks, bool trial) {
        std::vector<shoal::doctor::Item> items;
        {
          py::gil_scoped_release nogil;
          items = shoal::doctor::machine(ranks);
          if (trial) {
            auto t = shoal::doctor::trial(ranks);
            items.insert(items.end(), t.begin(), t.end());
          }
        }
        std::vector<DoctorItem> out;
        for (auto& i : items) out.emplace_back(i.section, i.key, i.value, i.warning);
        return out;
      },
      py::arg("ranks"), py::arg("trial"),
      "(section, key, value, warning) of shoal's report on this machine for `ranks` ranks here; with "
      "`trial`, after forming a group of that many forked ranks (fork: call it from a process with no "
      "other threads; python -m shoal doctor runs it in a fresh interpreter)");
  m.def(
      "doctor_format",
      [](const std::vector<DoctorItem>& items, bool json) {
        std::vector<shoal::doctor::Item> v;
        for (auto& [s, k, val, w] : items) v.push_back({s, k, val, w});
        return json ? shoal::doctor::json(v) : shoal::doctor::text(v);
      },
      py::arg("items"), py::arg("json"), "The report as text, or as JSON");
  m.def("doctor_params", &shoal::doctor::settings, "Every SHOAL_* variable: meaning and default (markdown)");

  // The creator torch.distributed calls (register_backend(..., extended_api=True)).
  m.def(
      "_create_backend",
      [](const c10d::DistributedBackendOptions& d, const py::object& options) {
        auto o = copy_options(options);
        o->timeout = std::chrono::duration_cast<std::chrono::milliseconds>(d.timeout);
        o->group_name = d.group_id;
        o->global_ranks_in_group.assign(d.global_ranks_in_group.begin(), d.global_ranks_in_group.end());
        auto store = d.store;
        int rank = d.group_rank, size = d.group_size;
        py::gil_scoped_release nogil;
        return c10::make_intrusive<BackendShoal>(store, rank, size, o);
      },
      py::arg("dist_backend_opts"), py::arg("pg_options") = py::none());
}
