#!/usr/bin/env python3
"""Medians of scripts/ab_by_core_state.sh's runs per op, ranks, core state and side.

A run whose round trip was under 120 ns counts as near, 300 ns or more as far, between as mid
(the state may have changed during the run). Prints, per (op, ranks, state): the runs of each side,
then each size's median µs old → new with the ratio new/old, and the slowest run of each side.

    python3 scripts/ab_by_core_state.py ab.txt
"""
import collections
import re
import statistics
import sys

LINE = re.compile(r"\S+ (\w+) n=(\d+) (old|new) rtt=(\d+) \| (.*)")


def state(rtt):
    return "near" if rtt < 120 else "far" if rtt >= 300 else "mid"


def main(path):
    runs = collections.defaultdict(lambda: {"old": [], "new": []})
    for line in open(path):
        m = LINE.match(line)
        if not m or not m.group(5).split():
            continue
        op, n, side, rtt, times = m.groups()
        runs[(op, int(n), state(int(rtt)))][side].append([float(t) for t in times.split()])
    for (op, n, st), sides in sorted(runs.items()):
        old, new = sides["old"], sides["new"]
        if not old or not new:
            continue
        k = min(len(r) for r in old + new)
        cells = []
        for i in range(k):
            o = statistics.median(r[i] for r in old)
            w = statistics.median(r[i] for r in new)
            cells.append(f"{o:.1f}→{w:.1f} ({w / o:.2f}; max {max(r[i] for r in old):.0f}, {max(r[i] for r in new):.0f})")
        print(f"{op} {n} ranks, {st}: {len(old)} old, {len(new)} new runs | " + " | ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1])
