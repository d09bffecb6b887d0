"""PyTorch's own distributed test suite on the shoal backend.

torch ships its distributed tests in the wheel:
``torch/testing/_internal/distributed/distributed_test.py`` (``DistributedTest._DistTestBase``,
run by ``TestDistBackend``: every test starts WORLD_SIZE fresh processes that call
``init_process_group(BACKEND)``). torch's ``test/distributed/test_distributed_spawn.py`` builds
its test class from these two; this file does the same for ``BACKEND=shoal``, which torch's
suite sees as a plugin backend (``DistTestCases.backend_feature["plugin"]``).

This file has two roles:

* collected by pytest normally, it defines ``test_torch_suite[n2]`` and ``[n3]``: each runs this
  file again in a child pytest with ``BACKEND=shoal WORLD_SIZE=n TEMP_DIR=...`` and
  ``SHOAL_TORCH_SUITE_CHILD=1`` (the two children run at the same time), and fails if any of
  torch's tests fails. By default the child
  runs the subset ``QUICK`` (the collectives, subgroups, DDP basics: a few minutes on 2 cores);
  ``SHOAL_TORCH_SUITE=full`` (``make test-torch-suite``) runs every test.
* in the child, it defines ``TestDistBackendWithShoal``: torch's tests, minus ``SKIPS`` below.

The processes of each test are forked from the child pytest (torch's spawn harness imports
torch again in every process: several seconds per test on 2 cores); ``SHOAL_TORCH_SUITE_SPAWN=1``
uses spawn as torch does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import pytest

CHILD = os.environ.get("SHOAL_TORCH_SUITE_CHILD") == "1"
HERE = os.path.dirname(os.path.abspath(__file__))

# ------------------------------------------------------------------------------------------------
# Tests of _DistTestBase that do not run on shoal, and why. Tests that torch itself skips for a
# plugin CPU backend (CUDA/NCCL-only, gloo-only by name, world-size requirements) are skipped by
# torch's own decorators and are not listed here; the child's report (-rs) names them.
# ------------------------------------------------------------------------------------------------
SKIPS: dict[str, str] = {
    # torch.distributed.monitored_barrier() (Python) raises ValueError for every backend but gloo
    # before reaching the process group. shoal implements the op (ProcessGroup.monitored_barrier,
    # shoal.torch.monitored_barrier; gloo's messages): test_monitored_barrier_gloo_rank_0_timeout
    # here and tests/python/test_groups_and_failures.py exercise it.
    "test_monitored_barrier_gloo": "dist.monitored_barrier() accepts only gloo groups (torch's Python check)",
    "test_monitored_barrier_gloo_subgroup": "dist.monitored_barrier() accepts only gloo groups (torch's Python check)",
    "test_monitored_barrier_failure_order": "dist.monitored_barrier() accepts only gloo groups (torch's Python check)",
    "test_monitored_barrier_wait_all_ranks": "dist.monitored_barrier() accepts only gloo groups (torch's Python check)",
    # DDP's logger records ProcessGroup.name(), "custom" for every plugin backend, and the test
    # wants it equal to dist.get_backend() ("shoal").
    "test_ddp_logging_data_cpu": "DDP logs backend_name 'custom' for plugin backends; the test expects 'shoal'",
}

# Tests whose bodies pick their code path by `BACKEND == "gloo"` (the CPU path) and have none for
# another CPU backend: the child runs their bodies with distributed_test.BACKEND = "gloo". The
# process groups are still shoal's (created before, by the default backend); the wrapper checks.
AS_GLOO: dict[str, str] = {
    "test_accumulate_gradients_no_sync": "model built only for mpi/gloo (CPU) or nccl",
    "test_accumulate_gradients_no_sync_grad_is_view": "model built only for mpi/gloo (CPU) or nccl",
    "test_accumulate_gradients_no_sync_allreduce_hook": "model built only for mpi/gloo (CPU) or nccl",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook": "model built only for mpi/gloo (CPU) or nccl",
}

# Tests torch's decorators skip for any backend not named in them (gloo, nccl, mpi, ucc) but
# that apply to a CPU backend with shoal's features: their skip mark is removed in the child. (A
# test with another skip reason too, e.g. "needs 2 GPUs", is skipped by that reason's runtime
# check, or torch's unconditional skip, still.)
UNSKIP: dict[str, str] = {
    # gated to {gloo, nccl, ucc}: object collectives and CPU DDP
    **{t: "gated to gloo/nccl/ucc" for t in [
        "test_all_gather_object_default_pg", "test_all_gather_object_subgroup", "test_broadcast_object_list",
        "test_gather_object", "test_gather_object_subgroup",
        "test_compute_bucket_assignment_by_size_sparse_error_without_logger", "test_ddp_bucket_cap_mb_list",
        "test_ddp_build_debug_param_to_name_mapping", "test_ddp_control_flow_different_across_ranks",
        "test_ddp_control_flow_same_across_ranks", "test_ddp_device", "test_ddp_device_mesh_initialization",
        "test_ddp_forward_backward_hook", "test_ddp_ignore_params_arg", "test_ddp_model_diff_num_params_across_ranks",
        "test_ddp_multiple_nested_unused_params_err_ignore_params", "test_ddp_multiple_nested_unused_params_error",
        "test_ddp_namedtuple", "test_ddp_profiling_torch_profiler", "test_ddp_shared_grad_acc_unused_params",
        "test_ddp_unused_params_rebuild_buckets_exception", "test_different_graph_across_ranks",
        "test_invalid_static_graph", "test_skip_all_reduce_unused_parameters",
        "test_verify_model_across_rank_with_logger", "test_verify_model_across_rank_without_logger",
        "test_monitored_barrier_allreduce_hang", "test_monitored_barrier_allreduce_hang_wait_all_ranks",
    ]},
    # gated to gloo
    **{t: "gated to gloo" for t in [
        "test_all_reduce_coalesced_full_group_max", "test_all_reduce_coalesced_full_group_min",
        "test_all_reduce_coalesced_full_group_product", "test_all_reduce_coalesced_full_group_sum",
        "test_all_reduce_coalesced_group_max", "test_all_reduce_coalesced_group_min",
        "test_all_reduce_coalesced_group_product", "test_all_reduce_coalesced_group_sum",
        "test_all_reduce_coalesced_max", "test_all_reduce_coalesced_min", "test_all_reduce_coalesced_product",
        "test_all_reduce_coalesced_sum", "test_grads_same_across_ranks_with_no_sync", "test_scatter_object_list",
        "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags",
        "test_barrier_timeout_full_group", "test_barrier_timeout_global", "test_barrier_timeout_group",
        "test_monitored_barrier_failure_order", "test_monitored_barrier_gloo", "test_monitored_barrier_gloo_rank_0_timeout",
        "test_monitored_barrier_gloo_subgroup", "test_monitored_barrier_wait_all_ranks",
    ]},
    # gated to mpi (CPU all-to-all): gloo skips them too, shoal has all-to-all(v)
    **{t: "gated to mpi" for t in [
        "test_all_to_all_single_equal_split", "test_all_to_all_single_equal_split_complex",
        "test_all_to_all_single_equal_split_full_group", "test_all_to_all_single_equal_split_group",
        "test_all_to_all_single_unequal_split", "test_all_to_all_single_unequal_split_complex",
        "test_all_to_all_single_unequal_split_full_group", "test_all_to_all_single_unequal_split_group",
        "test_all_to_all", "test_all_to_all_complex", "test_all_to_all_full_group", "test_all_to_all_group",
    ]},
    # gated to mpi/nccl/gloo: Work.get_future()
    **{t: "gated to mpi/nccl/gloo" for t in [
        "test_get_future", "test_accumulate_gradients_no_sync", "test_accumulate_gradients_no_sync_allreduce_hook",
        "test_accumulate_gradients_no_sync_allreduce_with_then_hook", "test_accumulate_gradients_no_sync_grad_is_view",
    ]},
    # gated to nccl/gloo: DDP
    **{t: "gated to nccl/gloo" for t in ["test_static_graph_multi_forward", "test_sync_bn_logged"]},
}

# Tests of a subgroup of ranks [1, 2] that torch skips below 8 ranks (skip_if_small_worldsize:
# "Skipped due to small world size", for every backend but MPI). They need 3 ranks: the child runs
# them, without that wrapper, at WORLD_SIZE >= 3.
SMALL_WORLD_OK = [
    "test_all_gather_coalesced_group", "test_all_gather_group",
    "test_all_reduce_coalesced_group_max", "test_all_reduce_coalesced_group_min",
    "test_all_reduce_coalesced_group_product", "test_all_reduce_coalesced_group_sum",
    "test_all_reduce_group_max", "test_all_reduce_group_min", "test_all_reduce_group_product", "test_all_reduce_group_sum",
    "test_all_to_all_group", "test_all_to_all_single_equal_split_group", "test_all_to_all_single_unequal_split_group",
    "test_barrier_group", "test_barrier_timeout_group", "test_broadcast_group", "test_gather_group",
    "test_reduce_group_max", "test_reduce_group_min", "test_reduce_group_product", "test_reduce_group_sum",
    "test_scatter_group",
]

# The subset `make test` runs (regular expressions over test names); the full suite runs with
# SHOAL_TORCH_SUITE=full.
QUICK = [
    r"^test_(all_reduce|reduce|broadcast|all_gather|gather|scatter|reduce_scatter|all_to_all|barrier)",
    r"^test_send_recv",
    r"^test_isend",
    r"^test_batch_isend",
    r"^test_new_subgroups",
    r"^test_destroy_group",
    r"^test_get_rank",
    r"^test_get_backend",
    r"^test_DistributedDataParallel$",
    r"^test_ddp_comm_hook_allreduce_hook",
    r"^test_ddp_logging_data_cpu",
    r"^test_ddp_sync_bn_training_vs_eval",
    r"^test_monitored_barrier",
]



def selected(test_name: str) -> bool:
    """Whether the child runs this test of torch's suite (conftest deselects the others)."""
    if os.environ.get("SHOAL_TORCH_SUITE", "full") == "full":
        return True
    return any(re.search(p, test_name) for p in QUICK)


if CHILD:
    import torch  # noqa: E402
    import torch.distributed as dist  # noqa: E402

    import shoal  # noqa: E402,F401  (registers the backend, in every rank process too)

    os.environ.setdefault("BACKEND", "shoal")
    assert os.environ["BACKEND"] == "shoal"
    from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

    # Before distributed_test is imported: its decorators read these sets.
    DistTestCases.backend_feature["plugin"].add("shoal")
    DistTestCases.backend_feature["ddp"].add("shoal")
    DistTestCases.backend_feature["subgroup"].add("shoal")

    import torch.testing._internal.distributed.distributed_test as _dt  # noqa: E402
    from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
        DistributedTest,
        TestDistBackend,
    )

    def _polling_faster(fn, poll_s=0.005):
        """fn with its sleeps between polls capped at poll_s. torch's harness polls at 0.1 s in
        the file barrier before and after every test (Barrier.sync) and while it waits for the
        test's processes (_join_processes): most of a test's time at these sizes. The waits end
        on the same conditions as before, only sooner."""
        import time
        import types

        clock = types.SimpleNamespace(time=time.time, sleep=lambda s: time.sleep(min(s, poll_s)))
        return types.FunctionType(fn.__code__, {**fn.__globals__, "time": clock}, fn.__name__,
                                  fn.__defaults__, fn.__closure__)

    from torch.testing._internal.common_distributed import MultiProcessTestCase  # noqa: E402

    _dt.Barrier.sync = classmethod(_polling_faster(_dt.Barrier.sync.__func__))
    MultiProcessTestCase._join_processes = _polling_faster(MultiProcessTestCase._join_processes)

    def _as_gloo(fn):
        import functools

        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            assert dist.get_backend() == "shoal"
            _dt.BACKEND = "gloo"
            try:
                return fn(self, *args, **kwargs)
            finally:
                _dt.BACKEND = "shoal"

        return wrapper

    def _final(name):
        """The test function the child runs for `name`, after the adjustments above."""
        fn = getattr(DistributedTest._DistTestBase, name)
        if (
            name in SMALL_WORLD_OK
            and int(os.environ["WORLD_SIZE"]) >= 3
            and fn.__code__.co_qualname.startswith("skip_if_small_worldsize")
        ):
            fn = fn.__wrapped__
        if name in UNSKIP:
            for attr in ("__unittest_skip__", "__unittest_skip_why__"):
                if attr in fn.__dict__:
                    delattr(fn, attr)
        if name in AS_GLOO:
            fn = _as_gloo(fn)
        return fn

    class TestDistBackendWithShoal(TestDistBackend, DistributedTest._DistTestBase):
        locals().update({name: _final(name) for name in {*UNSKIP, *AS_GLOO, *SMALL_WORLD_OK}})

        def setUp(self):
            name = self._testMethodName
            if name in SKIPS:
                self.skipTest(SKIPS[name])
            super().setUp()
            if os.environ.get("SHOAL_TORCH_SUITE_SPAWN") == "1":
                self._spawn_processes()
            else:
                import multiprocessing

                self._start_processes(multiprocessing.get_context("fork").Process)


else:

    WORLD_SIZES = (2, 3)

    @pytest.fixture(scope="module")
    def suite_runs(tmp_path_factory):
        """The children of both world sizes, started together: each spends most of its time
        starting processes and waiting on them, so the two overlap (on 2 cores about 95 s for
        both instead of 160 s one after the other)."""
        runs = {}
        for world_size in WORLD_SIZES:
            tmp_path = tmp_path_factory.mktemp(f"torch-suite-n{world_size}")
            env = dict(os.environ)
            env.update(
                SHOAL_TORCH_SUITE_CHILD="1",
                BACKEND="shoal",
                WORLD_SIZE=str(world_size),
                TEMP_DIR=str(tmp_path),
                # As torch's run_test.py does in one of its two passes; the tests that re-initialise
                # the default group need it (tcp:// and env:// re-initialisation is racy, says torch).
                INIT_METHOD=f"file://{tmp_path}/init_method_file",
            )
            junit = tmp_path / "report.xml"
            cmd = [
                sys.executable,
                "-m",
                "pytest",
                os.path.join(HERE, "test_torch_suite.py"),
                "-q",
                "-rfEs",
                "-p",
                "no:cacheprovider",
                f"--junitxml={junit}",
            ]
            out = open(tmp_path / "output.txt", "w+")
            p = subprocess.Popen(cmd, env=env, cwd=HERE, stdout=out, stderr=subprocess.STDOUT, text=True)
            runs[world_size] = (p, junit, out)
        yield runs
        for p, _, out in runs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
            out.close()

    @pytest.mark.parametrize("world_size", WORLD_SIZES, ids=lambda n: f"n{n}")
    def test_torch_suite(world_size, suite_runs):
        p, junit, out = suite_runs[world_size]
        p.wait()
        out.seek(0)
        output = out.read()
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        if junit.exists():
            suite = ET.parse(junit).getroot()
            suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
            counts = {k: int(suite.get(k, 0)) for k in counts}
        summary = (
            f"torch suite, WORLD_SIZE={world_size}: {counts['tests']} tests, "
            f"{counts['tests'] - counts['failures'] - counts['errors'] - counts['skipped']} passed, "
            f"{counts['skipped']} skipped, {counts['failures'] + counts['errors']} failed"
        )
        print(summary)
        assert p.returncode == 0, summary + "\n" + output[-25000:]
