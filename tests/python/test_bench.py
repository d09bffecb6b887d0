"""python -m shoal.bench: 2 ranks, tiny sizes, every op on shoal and gloo (all_reduce on shoal_inline too); the
check column, the DDP rows and the PNG."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from shoal.bench import ALL_OPS


def test_bench_json_and_plot(tmp_path):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    cmd = [sys.executable, "-m", "shoal.bench", "--backends", "shoal,gloo,shoal_inline", "--ops", ",".join(ALL_OPS),
           "-n", "2", "-b", "4K", "-e", "64K", "-f", "16", "--time", "0.01",
           "--json", str(out), "--plot", str(png), "--ddp", "--ddp-steps", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for op in ALL_OPS:
        assert f"# {op}, 2 ranks" in r.stdout
    res = json.loads(out.read_text())
    assert res["ranks"] == 2 and res["backends"] == ["shoal", "gloo", "shoal_inline"]
    rows = res["rows"]
    assert [(x["op"], x["bytes"]) for x in rows] == [(op, s) for op in ALL_OPS for s in (4096, 65536)]
    for x in rows:
        assert x["check"] == "ok", x
        for b in ("shoal", "gloo"):
            assert x[f"{b}_us"] > 0 and x[f"{b}_busbw"] > 0
        assert abs(x["ratio"] - x["gloo_us"] / x["shoal_us"]) < 1e-9
        # shoal_inline (shoal.torch.all_reduce_) has all_reduce only, checked like the others
        if x["op"] == "all_reduce":
            assert x["shoal_inline_us"] > 0
            assert abs(x["ratios"]["shoal_inline"] - x["shoal_inline_us"] / x["shoal_us"]) < 1e-9
        else:
            assert x["shoal_inline_us"] is None and "shoal_inline" not in x["ratios"]
    # busbw: all_reduce algbw * 2(p-1)/p = algbw at 2 ranks; all_gather & co (p-1)/p; broadcast algbw
    ar = rows[0]
    assert abs(ar["shoal_busbw"] - ar["bytes"] / ar["shoal_us"] / 1e3) < 1e-9
    ag = next(x for x in rows if x["op"] == "all_gather")
    assert abs(ag["gloo_busbw"] - ag["bytes"] / ag["gloo_us"] / 1e3 / 2) < 1e-9
    assert [d["model"] for d in res["ddp"]] == ["digits MLP", "wide MLP"]
    for d in res["ddp"]:
        assert d["shoal_ms"] > 0 and d["gloo_ms"] > 0 and d["compute_ms"] > 0
        assert abs(d["shoal_loss"] - d["gloo_loss"]) < 1e-4  # same seed, same data
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and os.path.getsize(png) > 10000


def _bench(tmp_path, *args, env=None):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "shoal.bench", "-n", "2", "--time", "0.01", "--json", str(out), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    return r, (json.loads(out.read_text()) if out.exists() else None)


def test_deepspeed_peer(tmp_path):
    """DeepSpeed's shm allreduce beside shoal: timed and checked for all_reduce, '-' for the rest."""
    pytest.importorskip("deepspeed")
    segments = lambda: {f for f in os.listdir("/dev/shm") if f.startswith("deepspeed_allreduce_buffer_")}
    before = segments()
    r, res = _bench(tmp_path, "--backends", "shoal,deepspeed", "--ops", "all_reduce,broadcast",
                    "-b", "8", "-e", "512K", "-f", "256")
    assert r.returncode == 0, r.stdout + r.stderr
    assert segments() - before == set(), "DeepSpeed's segments left in /dev/shm"
    assert "deepspeed/shoal" in r.stdout
    rows = res["rows"]
    assert [(x["op"], x["bytes"]) for x in rows] == [(op, s) for op in ("all_reduce", "broadcast")
                                                     for s in (8, 2048, 524288)]
    for x in rows:
        assert x["check"] == "ok", x
        assert x["shoal_us"] > 0
        if x["op"] == "all_reduce":
            assert x["deepspeed_us"] > 0
            assert abs(x["ratios"]["deepspeed"] - x["deepspeed_us"] / x["shoal_us"]) < 1e-9
        else:
            assert x["deepspeed_us"] is None and "deepspeed" not in x["ratios"]


def test_deepspeed_peer_missing_is_a_usage_error(tmp_path):
    """Without DeepSpeed the bench says how to get it before starting any rank."""
    fake = tmp_path / "fake" / "deepspeed"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no DeepSpeed in this test')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "fake") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r, res = _bench(tmp_path, "--backends", "shoal,deepspeed", "-b", "8", "-e", "8", env=env)
    assert r.returncode == 2 and res is None
    assert "pip install deepspeed" in r.stderr and "no DeepSpeed in this test" in r.stderr


def test_zero_steps(tmp_path):
    """--zero: ZeroRedundancyOptimizer steps on each backend; parameters checked against plain SGD."""
    r, res = _bench(tmp_path, "--backends", "shoal,gloo", "-n", "3", "-b", "4K", "-e", "4K", "--zero",
                    "--zero-steps", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "# ZeRO step" in r.stdout
    assert [z["model"] for z in res["zero"]] == ["digits MLP", "wide MLP", "400 small"]
    for z in res["zero"]:
        assert z["check"] == "ok", z
        assert z["shoal_ms"] > 0 and z["gloo_ms"] > 0 and z["compute_ms"] > 0
        assert z["ratio"] == z["gloo_ms"] / z["shoal_ms"]
    assert res["zero"][2]["tensors"] == 400
