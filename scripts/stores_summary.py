#!/usr/bin/env python3
"""Medians of scripts/stores_probe.sh's lines, split by the core state each pair ran in (the round
trip before it: near below --far-ns, far from it), and the other stores' (--other: streaming, or
auto) over cached.

    python3 scripts/stores_summary.py FILE [--far-ns 300] [--other streaming|auto]
"""
import argparse
import collections
import re
import statistics


def summarize(lines, far_ns=300, other="streaming"):
    """{(op, ranks, state, bytes): (cached median, `other` median, runs)} over complete pairs."""
    times = collections.defaultdict(list)
    for line in lines:
        m = re.match(r"(\w+) n=(\d+) rtt=(\d+) (cached|streaming|auto): (.*)", line.strip())
        if not m:
            continue
        op, n, rtt, stores, rest = m.groups()
        state = "far" if int(rtt) >= far_ns else "near"
        for cell in filter(None, rest.split(";")):
            size, _, us = cell.partition(" ")
            try:
                times[(op, int(n), state, int(size), stores)].append(float(us))
            except ValueError:  # a row the bench marked failed
                continue
    out = {}
    for (op, n, state, size, stores), _ in sorted(times.items()):
        a, b = times.get((op, n, state, size, "cached")), times.get((op, n, state, size, other))
        if a and b:
            out[(op, n, state, size)] = (statistics.median(a), statistics.median(b), min(len(a), len(b)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--far-ns", type=int, default=300)
    ap.add_argument("--other", choices=("streaming", "auto"), default="streaming")
    a = ap.parse_args()
    with open(a.file) as f:
        rows = summarize(f, a.far_ns, a.other)
    print(f"| op | ranks | cores | size | cached µs | {a.other} µs | {a.other}/cached | runs |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for (op, n, state, size), (c, s, runs) in rows.items():
        print(f"| {op} | {n} | {state} | {size >> 10} KiB | {c:.1f} | {s:.1f} | {s / c:.2f} | {runs} |")


if __name__ == "__main__":
    main()
