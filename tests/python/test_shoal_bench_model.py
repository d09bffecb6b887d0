"""build/shoal-bench --model: the algorithm's α-β-γ cost (src/algo/registry.cpp) fitted to the
run's times, printed after the table and written to the JSON."""

from __future__ import annotations

import json
import math
import os
import subprocess

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "build", "shoal-bench")

pytestmark = pytest.mark.skipif(not os.path.exists(BENCH), reason="build/shoal-bench is not built (make build)")


def run(*args, json_path=None):
    argv = [BENCH, *args] + (["--json", str(json_path)] if json_path else [])
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_ring_allreduce_model_fitted_and_reported(tmp_path):
    out = tmp_path / "bench.json"
    r = run("allreduce", "-n", "2", "-b", "8", "-e", "2M", "-f", "64", "--iters", "20", "--algo", "ring",
            "--model", json_path=out)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    m = res["model"]
    assert m["fitted"] is True
    assert [x["bytes"] for x in m["rows"]] == [x["bytes"] for x in res["rows"]] == [8, 512, 32768, 2097152]
    a, b, g = m["alpha_us"], m["beta_ns_per_byte"], m["gamma_ns_per_byte"]
    assert min(a, b, g) >= 0 and a + b + g > 0
    err2 = 0.0
    for x, row in zip(m["rows"], res["rows"]):
        n = x["bytes"]
        assert x["shoal_us"] == pytest.approx(row["shoal_us"], rel=1e-5)
        # The ring allreduce at p = 2: 2(p-1) messages, 2(p-1)/p·n bytes moved, (p-1)/p·n reduced.
        assert x["model_us"] == pytest.approx(2 * a + n * b * 1e-3 + n / 2 * g * 1e-3, rel=1e-4)
        err2 += ((x["model_us"] - x["shoal_us"]) / x["shoal_us"]) ** 2
    assert m["rms_relative_error"] == pytest.approx(math.sqrt(err2 / 4), rel=1e-3, abs=1e-6)
    assert "# model: allreduce ring, alpha-beta-gamma" in r.stdout and "shoal/model" in r.stdout


def test_model_needs_one_algorithm_and_two_sizes(tmp_path):
    r = run("allreduce", "-n", "2", "--model")
    assert r.returncode != 0 and "--model needs --algo" in r.stderr + r.stdout
    r = run("sendrecv", "-n", "2", "--algo", "ring", "--model")
    assert r.returncode != 0 and "--model needs --algo" in r.stderr + r.stdout
    out = tmp_path / "bench.json"
    r = run("broadcast", "-n", "2", "-b", "4K", "--iters", "5", "--algo", "mst", "--model", json_path=out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "needs two sizes or more" in r.stdout and json.loads(out.read_text())["model"] == {"fitted": False}
    r = run("allreduce", "-n", "2", "--algo", "linear", "--model")
    assert r.returncode != 0 and "allreduce has no algorithm 'linear' (it has: ring, bde, mst, direct" in r.stderr + r.stdout
    r = run("allreduce", "-n", "1", "--algo", "ring", "--model")
    assert r.returncode != 0 and "--model needs -n 2 or more" in r.stderr + r.stdout
