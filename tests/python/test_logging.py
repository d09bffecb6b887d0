"""SHOAL_LOG=debug: a line for each op a rank runs, describing it as the error of a mismatched call
does (its number among the rank's collectives, count, dtype, reduce op or root, algorithm)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "build", "shoal-bench")

pytestmark = pytest.mark.skipif(not os.path.exists(BENCH), reason="build/shoal-bench is not built (make build)")


@pytest.mark.parametrize("op,described", [
    ("allreduce", r"allreduce #(\d+) \(count 1024, f32, sum, algorithm [a-z_]+\)"),
    ("broadcast", r"broadcast #(\d+) \(count 1024, f32, root 0, algorithm [a-z_]+\)"),
    ("sendrecv", r"(send to rank 1|recv from rank 0) \(count 1024, f32, tag 0\)()"),
])
def test_debug_log_describes_each_op(op, described):
    env = dict(os.environ, SHOAL_LOG="debug")
    p = subprocess.run([BENCH, op, "-n", "2", "-b", "4K", "-e", "4K", "--iters", "4", "--warmup", "1"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    for rank in (0, 1):
        lines = [ln for ln in p.stderr.splitlines() if ln.startswith(f"[shoal rank {rank} ") and "] debug: " in ln]
        found = [m for ln in lines if (m := re.search(described + "$", ln))]
        # 1 warm-up and 4 timed ops (p2p: one side each)
        assert len(found) >= 5, f"rank {rank}: {len(found)} lines like {described!r} in:\n" + "\n".join(lines[-20:])
        if op != "sendrecv":  # the collectives' numbers count up, other collectives (barriers) between
            numbers = [int(m.group(1)) for m in found]
            assert numbers == sorted(set(numbers)), numbers
