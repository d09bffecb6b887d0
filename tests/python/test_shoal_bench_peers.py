"""build/shoal-bench --vs ompi: Open MPI as a peer in the same run (ranks started by mpirun), next to
Gloo; its results are checked like shoal's, and its columns are in the table and the JSON."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "build", "shoal-bench")

pytestmark = pytest.mark.skipif(not os.path.exists(BENCH), reason="build/shoal-bench is not built (make build)")


def bench(tmp_path, *args, timeout=120):
    out = tmp_path / "bench.json"
    r = subprocess.run([BENCH, *args, "--json", str(out)], capture_output=True, text=True, timeout=timeout)
    return r, (json.loads(out.read_text()) if out.exists() else None)


def needs_ompi(res):
    if "ompi" not in res:
        pytest.skip("shoal-bench was built without Open MPI: " + "; ".join(res.get("notes", [])))


@pytest.mark.parametrize(
    "op", ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "gather", "scatter", "alltoall",
           "sendrecv", "barrier"])
def test_every_op_checked_against_the_reference(tmp_path, op):
    r, res = bench(tmp_path, op, "-n", "3", "-b", "8", "-e", "96K", "-f", "64", "--iters", "20", "--check",
                   "--vs", "gloo,ompi")
    assert r.returncode == 0, r.stdout + r.stderr
    needs_ompi(res)
    assert res["ompi"].startswith("ompi: Open MPI"), res["ompi"]
    assert "ompi/shoal" in r.stdout
    rows = [x for x in res["rows"] if "skipped" not in x]
    assert rows
    for x in rows:
        assert x["ompi_us"] > 0 and x["ompi_check"] == "ok" and x["check"] == "ok", x
        # (the JSON holds 6 significant digits)
        assert x["ompi_ratio"] == pytest.approx(x["ompi_us"] / x["shoal_us"], rel=1e-4)
        assert x["ratio"] == pytest.approx(x["gloo_us"] / x["shoal_us"], rel=1e-4)  # gloo keeps its field
        if op != "barrier":
            assert x["ompi_busbw"] > 0


@pytest.mark.parametrize("dtype,rop", [("bool", "sum"), ("bool", "prod"), ("i8", "prod"), ("u8", "bxor"),
                                       ("i64", "min"), ("f64", "max")])
def test_dtypes_and_reduce_ops(tmp_path, dtype, rop):
    r, res = bench(tmp_path, "allreduce", "-n", "2", "-b", "64", "-e", "4K", "-f", "64", "--iters", "20", "--dtype", dtype,
                   "--op", rop, "--check", "--vs", "ompi")
    assert r.returncode == 0, r.stdout + r.stderr
    needs_ompi(res)
    for x in res["rows"]:
        assert x["ompi_check"] == "ok" and x["check"] == "ok", x


def test_what_mpi_lacks_is_an_error_in_its_column_only(tmp_path):
    r, res = bench(tmp_path, "allreduce", "-n", "2", "-b", "4K", "--dtype", "bf16", "--check", "--vs", "ompi")
    assert r.returncode == 0, r.stdout + r.stderr  # shoal's rows are fine
    needs_ompi(res)
    (x,) = res["rows"]
    assert x["check"] == "ok" and x["shoal_us"] > 0
    assert x["ompi_us"] is None and "MPI has no bf16 type" in x["ompi_error"], x
    assert "[ompi: rank 0: MPI has no bf16 type]" in r.stdout


def test_mpirun_arguments_pass_through(tmp_path):
    """--mpirun-args reaches mpirun: here, Open MPI's tuned allreduce forced to its ring (algorithm 4)."""
    if shutil.which("ompi_info") is None:
        pytest.skip("Open MPI is not installed")
    args = "--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4"
    r, res = bench(tmp_path, "allreduce", "-n", "3", "-b", "96K", "--check", "--vs", "ompi", "--mpirun-args", args)
    assert r.returncode == 0, r.stdout + r.stderr
    needs_ompi(res)
    assert res["rows"][0]["ompi_check"] == "ok"
    bad = subprocess.run([BENCH, "allreduce", "-n", "2", "--vs", "ompi", "--mpirun-args", "--no-such-mpirun-option"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "mpirun" in bad.stderr, bad.stdout + bad.stderr


def test_fresh_inputs_for_shoal_and_the_peers(tmp_path):
    """--fresh rewrites each rank's input before every timed op, for every library in the run, and
    the run says so (table header and JSON); the results still match the reference."""
    r, res = bench(tmp_path, "alltoall", "-n", "2", "-b", "256K", "-e", "256K", "--iters", "20", "--check",
                   "--fresh", "--vs", "gloo,ompi")
    assert r.returncode == 0, r.stdout + r.stderr
    assert res["fresh"] is True
    assert "each op after a rewrite of every cache line of the input (--fresh)" in r.stdout
    (row,) = res["rows"]
    assert row["check"] == "ok" and row["gloo_check"] == "ok", row
    if "ompi" in res:
        assert row["ompi_check"] == "ok", row
    r, res = bench(tmp_path, "alltoall", "-n", "2", "-b", "256K", "-e", "256K", "--iters", "5")
    assert r.returncode == 0 and res["fresh"] is False and "--fresh" not in r.stdout


@pytest.mark.parametrize("dtype,op", [("f32", "sum"), ("i32", "max"), ("f64", "prod")])
def test_allreduce_in_place_for_shoal_and_the_peers(tmp_path, dtype, op):
    """--in-place: every library's allreduce takes its input from its output buffer (a run that read
    the other buffer would reduce zeros), checked against the reference at sizes through the direct
    ways, in place up to 64 MiB in all and beyond; the run says so; other ops refuse it."""
    r, res = bench(tmp_path, "allreduce", "-n", "3", "-b", "32", "-e", "32M", "-f", "32", "--dtype", dtype, "--op", op,
                   "--iters", "3", "--check", "--in-place", "--vs", "gloo,ompi", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert res["in_place"] is True and "(--in-place)" in r.stdout
    assert [x["bytes"] for x in res["rows"]] == [32, 1 << 10, 32 << 10, 1 << 20, 32 << 20]
    for row in res["rows"]:
        assert row["check"] == "ok" and row["gloo_check"] == "ok", row
        if "ompi" in res:
            assert row["ompi_check"] == "ok", row
    bad = subprocess.run([BENCH, "broadcast", "-n", "2", "--in-place"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--in-place: allreduce only" in bad.stderr, bad.stdout + bad.stderr


@pytest.mark.parametrize("op,grows", [("allgather", 3), ("alltoall", 3), ("broadcast", 1), ("allreduce", 1)])
def test_plus_adds_bytes_to_every_ranks_block(tmp_path, op, grows):
    """--plus 4: every size grows by 4 bytes a block (ranks·4 for the ops whose size is the total of the
    blocks), for shoal and Open MPI alike, each row checked against the reference."""
    r, res = bench(tmp_path, op, "-n", "3", "-b", "12K", "-e", "48K", "-f", "4", "--plus", "4", "--iters", "20",
                   "--check", "--vs", "ompi")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [x["bytes"] for x in res["rows"]] == [12288 + 4 * grows, 49152 + 4 * grows]
    for x in res["rows"]:
        assert x["check"] == "ok", x
        if "ompi" in res and "ompi_check" in x:
            assert x["ompi_check"] == "ok", x
