"""Ranks held to fewer CPUs than the host has (taskset, a container's or a batch job's cpuset,
mpirun's binding): the group counts the CPUs in the union of its ranks' affinities, not the CPUs
online, and its waiters hand their CPU over when the ranks outnumber those (src/base/cpus.h;
BENCHMARKS.md, "Ranks held to fewer CPUs than the host has"). Each rank says which way it waits
in its "group ready" line (SHOAL_LOG=info); every run checks its results (--check)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
BENCH = os.path.join(ROOT, "build", "shoal-bench")
RUN = os.path.join(ROOT, "build", "shoal-run")

pytestmark = [
    pytest.mark.skipif(not (os.path.exists(BENCH) and os.path.exists(RUN)), reason="build/ is not built (make build)"),
    pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset (util-linux) is not installed"),
]
CPUS = sorted(os.sched_getaffinity(0))
READY = re.compile(r"rank (\d+) of \d+, .*; (\d+) ranks on this machine, (\d+) CPUs? for them: (waiters .+)$")


def _ready_lines(argv, env_extra=None):
    env = dict(os.environ, SHOAL_LOG="info", **(env_extra or {}))
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    found = {}
    for line in p.stderr.splitlines():
        m = READY.search(line)
        if m and "group ready" in line:
            found[int(m.group(1))] = (int(m.group(2)), int(m.group(3)), m.group(4))
    return found, p.stdout + p.stderr


def _bench(n):
    return [BENCH, "allreduce", "-n", str(n), "-b", "4K", "-e", "64K", "-f", "16", "--iters", "50", "--check"]


def test_ranks_held_to_one_cpu_hand_it_over():
    found, out = _ready_lines(["taskset", "-c", str(CPUS[0]), *_bench(2)])
    assert found == {0: (2, 1, "waiters hand their CPU over"), 1: (2, 1, "waiters hand their CPU over")}, out


@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs")
def test_ranks_pinned_to_cpus_of_their_own_poll():
    # Each rank held to a CPU of its own, as mpirun binds them: 1 CPU each, 2 between them.
    pin = f'exec taskset -c "$(echo {CPUS[0]} {CPUS[1]} | cut -d" " -f$((SHOAL_RANK + 1)))" "$@"'
    found, out = _ready_lines([RUN, "-n", "2", "--", "sh", "-c", pin, "sh", *_bench(2)])
    assert found == {0: (2, 2, "waiters poll first"), 1: (2, 2, "waiters poll first")}, out


@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs")
def test_more_ranks_than_the_cpus_they_are_pinned_to_hand_over():
    # Ranks 0 and 2 on the first CPU, rank 1 on the second: 3 ranks, 2 CPUs between them.
    pin = f'exec taskset -c "$(echo {CPUS[0]} {CPUS[1]} {CPUS[0]} | cut -d" " -f$((SHOAL_RANK + 1)))" "$@"'
    found, out = _ready_lines([RUN, "-n", "3", "--", "sh", "-c", pin, "sh", *_bench(3)])
    assert found == {r: (3, 2, "waiters hand their CPU over") for r in range(3)}, out


def test_ranks_of_simulated_hosts_on_one_machine_count_together():
    # Two host identities (as two containers, or SHOAL_HOST_ID) on one machine, both ranks held to
    # one CPU: they take the same CPU, TCP between them.
    pin = f'SHOAL_HOST_ID="h$SHOAL_RANK" exec taskset -c {CPUS[0]} "$@"'
    found, out = _ready_lines([RUN, "-n", "2", "--", "sh", "-c", pin, "sh", *_bench(2)])
    assert found == {0: (2, 1, "waiters hand their CPU over"), 1: (2, 1, "waiters hand their CPU over")}, out
    assert "transport auto (rank 0 -> 1: tcp)" in out, out
