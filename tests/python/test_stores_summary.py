"""scripts/stores_summary.py: medians of scripts/stores_probe.sh's lines by op, ranks, core state
(the round trip before the pair) and size, streaming over cached."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "stores_summary.py")
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import stores_summary  # noqa: E402

LINES = [
    "broadcast n=2 rtt=120 cached: 65536 8.0;1048576 30.0;",
    "broadcast n=2 rtt=120 streaming: 65536 5.0;1048576 60.0;",
    "broadcast n=2 rtt=130 cached: 65536 10.0;1048576 34.0;",
    "broadcast n=2 rtt=130 streaming: 65536 4.0;1048576 58.0;",
    "broadcast n=2 rtt=125 cached: 65536 9.0;1048576 32.0;",
    "broadcast n=2 rtt=125 streaming: 65536 6.0;1048576 62.0;",
    "broadcast n=2 rtt=510 cached: 65536 30.0;1048576 300.0;",
    "broadcast n=2 rtt=510 streaming: 65536 5.0;1048576 50.0;",
    "alltoall n=4 rtt=500 cached: 262144 140.0;",  # no streaming run in that state: left out
    "gather n=2 rtt=120 cached: 65536 4.0;262144 error;",  # a failed row: skipped
    "gather n=2 rtt=120 streaming: 65536 5.0;262144 6.0;",
    "Model name: anything else is skipped",
]


def test_medians_by_state_and_size():
    rows = stores_summary.summarize(LINES)
    assert rows[("broadcast", 2, "near", 65536)] == (9.0, 5.0, 3)
    assert rows[("broadcast", 2, "near", 1048576)] == (32.0, 60.0, 3)
    assert rows[("broadcast", 2, "far", 65536)] == (30.0, 5.0, 1)
    assert ("alltoall", 4, "far", 262144) not in rows
    assert rows[("gather", 2, "near", 65536)] == (4.0, 5.0, 1)
    assert ("gather", 2, "near", 262144) not in rows
    assert len(rows) == 5


def test_the_far_threshold_moves_the_split():
    rows = stores_summary.summarize(LINES, far_ns=126)
    assert rows[("broadcast", 2, "near", 65536)] == (8.5, 5.5, 2)  # rtt 120 and 125
    assert rows[("broadcast", 2, "far", 65536)] == (20.0, 4.5, 2)  # rtt 130 and 510


def test_table(tmp_path):
    f = tmp_path / "probe.txt"
    f.write_text("\n".join(LINES) + "\n")
    out = subprocess.run([sys.executable, SCRIPT, str(f)], check=True, capture_output=True, text=True).stdout
    assert "| broadcast | 2 | near | 1024 KiB | 32.0 | 60.0 | 1.88 | 3 |" in out
    assert "| broadcast | 2 | far | 64 KiB | 30.0 | 5.0 | 0.17 | 1 |" in out


def test_auto_against_cached():
    lines = LINES + [
        "broadcast n=2 rtt=120 auto: 65536 8.5;1048576 31.0;",
        "broadcast n=2 rtt=510 auto: 65536 6.0;1048576 55.0;",
    ]
    rows = stores_summary.summarize(lines, other="auto")
    assert rows[("broadcast", 2, "near", 65536)] == (9.0, 8.5, 1)
    assert rows[("broadcast", 2, "far", 1048576)] == (300.0, 55.0, 1)
    assert len(rows) == 4  # no auto line for gather
