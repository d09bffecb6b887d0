"""scripts/worst_ratios.py: the median over runs of each size's peer/shoal ratio, the worst
median per op and group size, and the sizes whose median is below 1.0."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "worst_ratios.py")


def run_dir(tmp_path, name, files):
    """A run_benchmarks.py --out folder: {file name: [(bytes, shoal_us, ompi_us)]}."""
    d = tmp_path / name
    d.mkdir()
    for fname, rows in files.items():
        (d / fname).write_text(json.dumps(
            {"rows": [{"bytes": b, "shoal_us": s, "ompi_us": o} for b, s, o in rows]}))
    return str(d)


def table(out):
    """{(op, ranks): row cells} from the script's markdown table."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 5 and cells[1].isdigit():
            rows[(cells[0], int(cells[1]))] = cells
    return rows


def test_worst_median_and_sizes_below_one(tmp_path):
    # allreduce at 2 ranks, three runs. 64 B: ratios 2.0, 0.5, 1.5 -> median 1.5.
    # 4 KiB: 0.8, 0.9, 0.6 -> median 0.8 (the worst, below 1). 1 MiB: 1.2 in every run.
    runs = [
        [(64, 1.0, 2.0), (4096, 10.0, 8.0), (1 << 20, 100.0, 120.0)],
        [(64, 1.0, 0.5), (4096, 10.0, 9.0), (1 << 20, 100.0, 120.0)],
        [(64, 2.0, 3.0), (4096, 10.0, 6.0), (1 << 20, 100.0, 120.0)],
    ]
    dirs = [run_dir(tmp_path, f"r{i}", {"allreduce-2-auto-vs-ompi.json": rows,
                                        # another transport and peer: not read
                                        "allreduce-2-tcp-vs-ompi.json": [(64, 100.0, 1.0)],
                                        "allreduce-2-auto-vs-gloo.json": [(64, 100.0, 1.0)]})
            for i, rows in enumerate(runs)]
    out = subprocess.run([sys.executable, SCRIPT, *dirs], capture_output=True, text=True, check=True).stdout
    t = table(out)
    assert set(t) == {("allreduce", 2)}
    cells = t[("allreduce", 2)]
    assert cells[2] == "0.80 at 4K (0.60-0.90)"
    assert cells[3] == "4K: 0.80 (0.60-0.90)"
    assert cells[4] == "3"


def test_ops_and_group_sizes_apart_and_nothing_below_one(tmp_path):
    d = run_dir(tmp_path, "r1", {
        "broadcast-4-auto-vs-ompi.json": [(8, 1.0, 1.1), (512, 2.0, 5.0)],
        "broadcast-8-auto-vs-ompi.json": [(8, 1.0, 0.5)],
    })
    t = table(subprocess.run([sys.executable, SCRIPT, d], capture_output=True, text=True, check=True).stdout)
    assert t[("broadcast", 4)][2:4] == ["1.10 at 8 B (1.10-1.10)", "-"]
    assert t[("broadcast", 8)][2:4] == ["0.50 at 8 B (0.50-0.50)", "8 B: 0.50 (0.50-0.50)"]


def test_no_rows_is_an_error(tmp_path):
    d = run_dir(tmp_path, "r1", {"allreduce-2-auto-vs-gloo.json": [(64, 1.0, 1.0)]})
    r = subprocess.run([sys.executable, SCRIPT, d, "--peer", "ompi"], capture_output=True, text=True)
    assert r.returncode != 0 and "no rows against ompi" in r.stderr
