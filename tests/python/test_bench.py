"""python -m shoal.bench: 2 ranks, tiny sizes, every op on shoal and gloo; the JSON rows, the
check column, the DDP rows and the PNG."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from shoal.bench import ALL_OPS


def test_bench_json_and_plot(tmp_path):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    cmd = [sys.executable, "-m", "shoal.bench", "--backends", "shoal,gloo", "--ops", ",".join(ALL_OPS),
           "-n", "2", "-b", "4K", "-e", "64K", "-f", "16", "--time", "0.01",
           "--json", str(out), "--plot", str(png), "--ddp", "--ddp-steps", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for op in ALL_OPS:
        assert f"# {op}, 2 ranks" in r.stdout
    res = json.loads(out.read_text())
    assert res["ranks"] == 2 and res["backends"] == ["shoal", "gloo"]
    rows = res["rows"]
    assert [(x["op"], x["bytes"]) for x in rows] == [(op, s) for op in ALL_OPS for s in (4096, 65536)]
    for x in rows:
        assert x["check"] == "ok", x
        for b in ("shoal", "gloo"):
            assert x[f"{b}_us"] > 0 and x[f"{b}_busbw"] > 0
        assert abs(x["ratio"] - x["gloo_us"] / x["shoal_us"]) < 1e-9
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
