"""scripts/tune_algos.py: where it puts the switches of the automatic choice (chain_cuts,
switch_value, switch_lines), how it adds lines to a tuning file (emit), and that what it writes is
a tuning file the library takes and follows."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import tune_algos as ta  # noqa: E402

BENCH = os.path.join(ROOT, "build", "shoal-bench")
SIZES = [4096, 16384, 65536, 262144, 1048576]


def table(*rows):
    """{algorithm: {bytes: µs}} from one list of times per algorithm, over SIZES."""
    return [dict(zip(SIZES, r)) for r in rows]


def loss(sizes, times, cuts):
    """The chain's loss for `cuts`, computed here: sum over sizes of log(time / fastest)."""
    total = 0.0
    for i, n in enumerate(sizes):
        a = sum(1 for c in cuts if c <= i)
        total += math.log(times[a][n] / min(t[n] for t in times))
    return total


def test_each_algorithm_where_it_is_fastest():
    # mst fastest at 4-16 KiB, bde at 64-256 KiB, ring at 1 MiB: cuts before 64 KiB and 1 MiB.
    times = table([1, 2, 9, 30, 90], [3, 4, 5, 10, 40], [9, 9, 9, 20, 30])
    assert ta.chain_cuts(SIZES, times) == (2, 4)
    assert ta.switch_value(SIZES, 2) == round(math.sqrt(16384 * 65536))  # 32 KiB
    assert ta.switch_value(SIZES, 4) == round(math.sqrt(262144 * 1048576))


def test_ends_of_the_chain():
    assert ta.chain_cuts(SIZES, table([1] * 5, [2] * 5)) == (5,)  # the second never wins
    assert ta.switch_value(SIZES, 5) == "never"
    assert ta.chain_cuts(SIZES, table([2] * 5, [1] * 5)) == (0,)  # it wins everywhere
    assert ta.switch_value(SIZES, 0) == 0


def test_a_chain_cannot_go_back_and_loses_least():
    # The ring wins at 16 KiB alone, amid bde's sizes: the chain (monotone) cannot follow it, and the
    # cuts it takes lose no more than any other monotone cuts.
    times = table([1, 9, 9, 9, 9], [5, 3, 2, 2, 3], [5, 2, 4, 4, 2])
    best = ta.chain_cuts(SIZES, times)
    every = [(a, b) for a in range(6) for b in range(a, 6)]
    assert loss(SIZES, times, best) == pytest.approx(min(loss(SIZES, times, c) for c in every))


def test_switch_lines_name_the_group_size_and_the_chain_that_applies():
    res = {"mst": dict(zip(SIZES, [1, 2, 9, 30, 90])), "bde": dict(zip(SIZES, [3, 4, 5, 10, 40])),
           "ring": dict(zip(SIZES, [9, 9, 9, 20, 30]))}
    four = ta.switch_lines("allreduce", 4, res, SIZES, hosts=True)
    assert four == ["switch allreduce.mst_below@4 32768", f"switch allreduce.bde_up_to@4 {round(math.sqrt(262144 * 1048576))}"]
    # p not a power of two: its own switch for bde to ring; the first one is a power of two's.
    assert ta.switch_lines("allreduce", 3, res, SIZES, hosts=True) == [
        f"switch allreduce.bde_up_to_odd_p@3 {round(math.sqrt(262144 * 1048576))}"]
    bc = {"mst": dict(zip(SIZES, [1] * 5)), "scatter_allgather": dict(zip(SIZES, [2] * 5)),
          "linear": dict(zip(SIZES, [3] * 5)), "ring": dict(zip(SIZES, [3] * 5))}
    assert [x.split()[1] for x in ta.switch_lines("broadcast", 4, bc, SIZES, hosts=True)] == ["broadcast.mst_below@4"]
    assert [x.split()[1] for x in ta.switch_lines("broadcast", 4, bc, SIZES, hosts=False)] == [
        "broadcast.one_host.mst_below@4", "broadcast.chain_from@4"]
    assert ta.switch_lines("gather", 4, {"mst": res["mst"]}, SIZES, hosts=True) == []  # linear not measured


def test_emit_replaces_the_same_lines_and_keeps_the_rest(tmp_path, capsys):
    f = tmp_path / "tuning.txt"
    ta.emit(["# first", "switch gather.mst_below@4 0", "switch scatter.mst_below@4 65536"], str(f))
    ta.emit(["switch gather.mst_below@4 65536", "switch gather.mst_below@8 never"], str(f))
    ta.emit(["direct allreduce 2 16384 1 2"], str(f))
    ta.emit(["direct allreduce 2 16384 3 4"], str(f))
    lines = f.read_text().splitlines()
    assert lines == ["# first", "switch scatter.mst_below@4 65536", "switch gather.mst_below@4 65536",
                     "switch gather.mst_below@8 never", "direct allreduce 2 16384 3 4"]
    assert "switch gather.mst_below@4 65536" in capsys.readouterr().out


def test_emit_into_a_built_in_points_file_stays_inside_its_raw_string(tmp_path):
    # src/algo/cost_points*.inc are C++ raw strings: new points go before the closing `)"`.
    f = tmp_path / "points.inc"
    f.write_text('// comment\nR"(\ndirect scatter 2 16384 1 2 3 4\ndirect gather 2 16384 1 2 3 4\n)"\n')
    ta.emit(["# tuned again", "direct scatter 2 16384 5 6 7 8"], str(f))
    assert f.read_text().splitlines() == ["// comment", 'R"(', "direct gather 2 16384 1 2 3 4", "# tuned again",
                                          "direct scatter 2 16384 5 6 7 8", ')"']


@pytest.mark.skipif(not os.path.exists(BENCH), reason="build/shoal-bench is not built (make build)")
@pytest.mark.parametrize("at, want", [(1 << 30, "mst"), (0, "bde")])
def test_the_library_follows_what_the_tune_writes(tmp_path, at, want):
    # Two ranks over TCP on this host: allreduce's first switch decides between mst and bde.
    f = tmp_path / "tuning.txt"
    ta.emit([f"switch allreduce.mst_below@2 {at}"], str(f))
    out = tmp_path / "bench.json"
    env = dict(os.environ, SHOAL_TUNING=str(f))
    r = subprocess.run([BENCH, "allreduce", "-n", "2", "-b", "64K", "-e", "64K", "--transport", "tcp", "--iters", "3",
                        "--json", str(out)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(out.read_text())["rows"][0]["shoal_algo"] == want
