// `shoal doctor`: what shoal will do on this machine, as `ompi_info` and NCCL_DEBUG=INFO tell
// theirs. The C++ tool (`shoal-doctor`) and `python -m shoal doctor` (which adds torch's and
// Ray's side) print the same report. docs/doctor.md lists every field.
#pragma once
#include <string>
#include <vector>

namespace shoal::doctor {

struct Item {
  std::string section;  // "shoal", "cpu", "shared memory", ...
  std::string key;
  std::string value;
  bool warning = false;  // something that fails or slows a group here, with the fix in `value`
};

// The machine as shoal sees it, for a group of `ranks` ranks on this host (segment sizes,
// descriptors); forms no group.
std::vector<Item> machine(int ranks);
// Forms a group of `ranks` processes on this host (forked; at most `timeout_s` seconds) and
// reports each pair's transport, whether single copy is on, and the time of a 4 KiB and a 16 MiB
// allreduce (f32, max over ranks of the mean).
std::vector<Item> trial(int ranks, double timeout_s = 60);
// Readable text, one section after another, warnings marked with '!'; or JSON:
// {"sections": {section: {key: value}}, "warnings": ["section: key: value", ...]}.
std::string text(const std::vector<Item>& items);
std::string json(const std::vector<Item>& items);
// Every SHOAL_* variable, its meaning and default, as a markdown table (README.md's).
std::string settings();

}  // namespace shoal::doctor
