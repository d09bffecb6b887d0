"""python -m shoal.ray.profile at a small world and size: every row present, every result
checked, the JSON well formed. In-process through main(), on the session's local Ray."""

import json

import pytest

pytest.importorskip("ray")

from shoal.ray import profile as prof  # noqa: E402

WORLD, TRIALS, WARMUP = 3, 3, 1
ROWS = ["p2p gloo", "p2p shoal", "allreduce gloo", "allreduce shoal ring", "allreduce shoal bde",
        "allreduce shoal mst", "allreduce shoal auto"]
GET_ROWS = ["ray.get no-op", "ray.get allreduce gloo", "ray.get allreduce shoal"]


def test_parse_count():
    assert prof.parse_count("8388608") == 8388608
    assert prof.parse_count("16K") == prof.parse_count("16Ki") == 16384
    assert prof.parse_count("8M") == 8 << 20
    assert prof.parse_counts("1K,4K,") == [1024, 4096]
    assert prof.batch_for(4096) == 16 and prof.batch_for(32 << 20) == 1 and prof.batch_for(1 << 20) == 16
    assert prof.batch_for(32 << 20, 3) == 3
    with pytest.raises(Exception):
        prof.parse_count("12Q")


def test_reference_is_exact():
    import numpy as np

    ref = prof.allreduce_reference(1000, 5)
    total = sum(prof.rank_input(1000, r).astype(np.float64) for r in range(5))
    assert np.array_equal(ref, total.astype(np.float32))


def test_profile_small(ray_local, tmp_path, capsys):
    out = tmp_path / "profile.json"
    rc = prof.main(["--world", str(WORLD), "--size", "4K", "--sizes", "1K", "--trials", str(TRIALS),
                    "--warmup", str(WARMUP), "--batch", "2", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert ray_local.is_initialized()  # the session's Ray is left running

    # The table: one block per size, every row in each, each with its check.
    for count, nbytes in ((4096, "16 KiB"), (1024, "4 KiB")):
        assert f"size {count} elements ({nbytes}), 2 call(s) per trial" in text
    for row in ROWS:
        assert sum(1 for line in text.splitlines() if line.startswith(row + " ")) == 2, row
    assert "target: allreduce shoal auto at 16 KiB" in text
    assert "target: ray.get allreduce shoal at 16 KiB" in text
    assert text.count("timed in the driver, one ray.get of every actor's call per trial, no barrier") == 2

    res = json.loads(out.read_text())
    assert res["world"] == WORLD and res["trials"] == TRIALS and res["warmup"] == WARMUP
    assert res["transports_rank0"] == ["shm"]
    assert [r["row"] for r in res["rows"]] == (ROWS + GET_ROWS) * 2
    per_get = [r for r in res["rows"] if r["row"] in GET_ROWS]
    for r in per_get:
        # One checked call of every actor after the timed ones (none for the no-op).
        assert r["checked"] == (0 if r["row"] == "ray.get no-op" else WORLD), r
        assert 0 < r["min_us"] <= r["time_us"] <= r["max_us"]
        noop = next(x for x in per_get if x["count"] == r["count"] and x["row"] == "ray.get no-op")
        assert r["x_noop"] == pytest.approx(r["time_us"] / noop["time_us"], rel=1e-2)
        if r["row"] == "ray.get allreduce shoal":
            gloo = next(x for x in per_get if x["count"] == r["count"] and x["row"] == "ray.get allreduce gloo")
            assert r["speedup_vs_gloo"] == pytest.approx(gloo["time_us"] / r["time_us"], rel=1e-2)
    for r in res["rows"]:
        if r in per_get:
            continue
        # Every call (warm-up included) was compared with numpy: on every rank for allreduce,
        # on the receiving rank for p2p.
        assert r["batch"] == 2
        want = (TRIALS + WARMUP) * r["batch"] * (WORLD if r["op"] == "allreduce" else 1)
        assert r["checked"] == want, r
        assert r["ranks_checked"] == (list(range(WORLD)) if r["op"] == "allreduce" else [prof.P2P_DST])
        assert r["time_us"] > 0 and r["busbw_GBps"] > 0
        if r["backend"] == "shoal":
            assert r["speedup_vs_gloo"] > 0
        if r["op"] == "allreduce":
            assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 2 * (WORLD - 1) / WORLD, rel=1e-3)
        else:
            assert r["busbw_GBps"] == r["algbw_GBps"]
    assert {t["count"] for t in res["targets"]} == {4096, 1024}
