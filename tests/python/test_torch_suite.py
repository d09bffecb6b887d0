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
  ``SHOAL_TORCH_SUITE_CHILD=1``, and fails if any of torch's tests fails. By default the child
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
    # recv from any source: shoal matches every message to its sender (documented in docs/torch.md);
    # the backend raises a clear RuntimeError instead.
    "test_send_recv_any_source": "recv without src (any source) is not supported by shoal",
    "test_send_recv_any_source_autograd_profiler": "recv without src (any source) is not supported by shoal",
    "test_send_recv_any_source_torch_profiler": "recv without src (any source) is not supported by shoal",
    "test_irecv": "recv without src (any source) is not supported by shoal",
}

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
    if os.environ.get("SHOAL_TORCH_SUITE", "quick") == "full":
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
    DistTestCases.skip_collective["sendrecv anysource"].add("shoal")

    from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
        DistributedTest,
        TestDistBackend,
    )

    class TestDistBackendWithShoal(TestDistBackend, DistributedTest._DistTestBase):
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

    @pytest.mark.parametrize("world_size", [2, 3], ids=lambda n: f"n{n}")
    def test_torch_suite(world_size, tmp_path):
        env = dict(os.environ)
        env.update(
            SHOAL_TORCH_SUITE_CHILD="1",
            BACKEND="shoal",
            WORLD_SIZE=str(world_size),
            TEMP_DIR=str(tmp_path),
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
        p = subprocess.run(cmd, env=env, cwd=HERE, capture_output=True, text=True)
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
        assert p.returncode == 0, summary + "\n" + p.stdout[-20000:] + p.stderr[-5000:]
