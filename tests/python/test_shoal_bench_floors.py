"""build/shoal-bench --floors: the machine's memory bandwidth, cache-line round trip and core
hand-over, measured before the ranks start, and each row's time over them, in the table and the
JSON."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "build", "shoal-bench")

pytestmark = pytest.mark.skipif(not os.path.exists(BENCH), reason="build/shoal-bench is not built (make build)")


def bench(tmp_path, *args, prefix=()):
    out = tmp_path / "bench.json"
    r = subprocess.run([*prefix, BENCH, *args, "--floors", "--json", str(out)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout, json.loads(out.read_text())


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the round trip needs two cores")
def test_allreduce_against_both_floors(tmp_path):
    out, res = bench(tmp_path, "allreduce", "-n", "2", "-b", "8", "-e", "4M", "-f", "512", "--iters", "20")
    fl = res["floors"]
    # A copy moves between 0.5 GB/s and 10 TB/s on any machine this runs on; a line's round trip
    # between two cores takes between 10 ns and 1 ms (a loaded VM included).
    assert 0.5 < fl["memory_bw_GBps"] < 10000 and fl["memory_bw_threads"] == len(os.sched_getaffinity(0))
    assert 10 < fl["cacheline_rtt_ns"] < 1e6
    # A process switch costs at least tens of ns and, on a loaded VM, under 10 ms.
    assert 20 < fl["core_handover_ns"] < 1e7 and "hands its core to another" in out
    assert "# floors: memory bandwidth B =" in out and "t/mem" in out and "t/rtt" in out
    assert [x["bytes"] for x in res["rows"]] == [8, 4096, 2097152]
    for x in res["rows"]:
        floor_us = 2 * 2 * x["bytes"] / (fl["memory_bw_GBps"] * 1e9) * 1e6  # 2*p*n/B
        # (the JSON holds 6 significant digits)
        assert x["shoal_over_mem_floor"] == pytest.approx(x["shoal_us"] / floor_us, rel=1e-4)
        assert x["shoal_over_rtt"] == pytest.approx(x["shoal_us"] * 1e3 / fl["cacheline_rtt_ns"], rel=1e-4)


def test_other_ops_have_no_memory_floor_and_one_core_no_round_trip(tmp_path):
    out, res = bench(tmp_path, "broadcast", "-n", "2", "-b", "4K", "-e", "4K", "--iters", "20",
                     prefix=("taskset", "-c", str(min(os.sched_getaffinity(0)))))
    assert res["floors"]["cacheline_rtt_ns"] is None and res["floors"]["memory_bw_threads"] == 1
    assert 20 < res["floors"]["core_handover_ns"] < 1e7  # one core is enough for the hand-over
    assert "not measured (one core allowed)" in out
    (x,) = res["rows"]
    assert x["shoal_us"] > 0 and x["shoal_over_mem_floor"] is None and x["shoal_over_rtt"] is None
