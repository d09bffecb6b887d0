#!/usr/bin/env python3
"""Medians of scripts/ab_by_core_state.sh's runs per op, ranks, core state and side.

A run whose round trip was under 120 ns counts as near, 300 ns or more as far, between as mid
(the state may have changed during the run). Prints, per (op, ranks, state): the runs of each side,
then each size's median µs old → new with the ratio new/old, and the slowest run of each side.

    python3 scripts/ab_by_core_state.py ab.txt

With --worst, for files of BENCH_PEER runs (old: the peer, new: shoal), each given with the labels
of its sizes, prints per core state (and for every run, "any") a table of the least median of
old's time over new's across the sizes of all files, per op and ranks, with the size and the
fewest runs of a size:

    python3 scripts/ab_by_core_state.py --worst "small.txt:8 B,64 B,512 B,4K" "large.txt:64K,256K,1M"
"""
import collections
import re
import statistics
import sys

LINE = re.compile(r"\S+ (\w+) n=(\d+) (old|new) rtt=(\d+) \| (.*)")


def state(rtt):
    return "near" if rtt < 120 else "far" if rtt >= 300 else "mid"


def number(t):
    """A time, or None for a size the bench skipped (its word in place of the time)."""
    try:
        return float(t)
    except ValueError:
        return None


def read(path, pooled=False):
    """{(op, ranks, state): {"old": [[µs or None per size] per run], "new": [...]}}; with pooled,
    also every run of each op and ranks under the state "any"."""
    runs = collections.defaultdict(lambda: {"old": [], "new": []})
    for line in open(path):
        m = LINE.match(line)
        if not m or not m.group(5).split():
            continue
        op, n, side, rtt, times = m.groups()
        row = [number(t) for t in times.split()]
        runs[(op, int(n), state(int(rtt)))][side].append(row)
        if pooled:
            runs[(op, int(n), "any")][side].append(row)
    return runs


def size_medians(sides, i):
    """The medians of old's and new's runs at size i, and their runs (None where a side has none)."""
    old = [r[i] for r in sides["old"] if len(r) > i and r[i] is not None]
    new = [r[i] for r in sides["new"] if len(r) > i and r[i] is not None]
    if not old or not new:
        return None
    return statistics.median(old), statistics.median(new), old, new


def main(path):
    for (op, n, st), sides in sorted(read(path).items()):
        old, new = sides["old"], sides["new"]
        if not old or not new:
            continue
        cells = []
        for i in range(min(len(r) for r in old + new)):
            m = size_medians(sides, i)
            if m is None:
                cells.append("skipped")
                continue
            o, w, o_runs, w_runs = m
            cells.append(f"{o:.3g}→{w:.3g} ({w / o:.2f}; max {max(o_runs):.3g}, {max(w_runs):.3g})")
        print(f"{op} {n} ranks, {st}: {len(old)} old, {len(new)} new runs | " + " | ".join(cells))


def worst(specs):
    cells = collections.defaultdict(dict)  # (op, ranks, state) -> label -> (old/new, runs)
    for spec in specs:
        path, labels = spec.rsplit(":", 1)
        for key, sides in read(path, pooled=True).items():
            for i, label in enumerate(labels.split(",")):
                m = size_medians(sides, i)
                if m is not None:
                    cells[key][label] = (m[0] / m[1], min(len(m[2]), len(m[3])))
    ops = sorted({k[0] for k in cells})
    # "mid": on an Intel Xeon most runs fall between the two (BENCHMARKS.md, "Short copies on an
    # Intel Xeon"); "any": every run.
    for st in [st for st in ("near", "mid", "far", "any") if any(k[2] == st for k in cells)]:
        print(f"\n{st}: least median of old's time over new's (size; fewest runs of a size)\n")
        print("| op | 2 ranks | 4 ranks | 8 ranks |\n|---|---|---|---|")
        for op in ops:
            row = []
            for n in (2, 4, 8):
                d = cells.get((op, n, st))
                if not d:
                    row.append("")
                    continue
                label, (ratio, _) = min(d.items(), key=lambda kv: kv[1][0])
                row.append(f"{ratio:.2f} at {label} ({min(v[1] for v in d.values())})")
            print(f"| {op} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    if sys.argv[1] == "--worst":
        worst(sys.argv[2:])
    else:
        main(sys.argv[1])
