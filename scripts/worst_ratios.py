#!/usr/bin/env python3
"""Per op and group size, the worst of the median peer/shoal time ratios over several runs.

One run of `scripts/run_benchmarks.py` is one sample of a machine whose rows move by up to 2x
from run to run; this reads the JSON that several runs kept (their --out folders) and, for each
(op, ranks, size), takes the median of the runs' ratios (each from one run, shoal and the peer
timed in the same process tree), then prints the smallest median per op and group size and every
size whose median is below 1.0, each with the runs' range:

    for r in 1 2 3 4 5; do for n in 2 4 8; do
      .venv/bin/python scripts/run_benchmarks.py --ranks $n --vs ompi --transports auto \\
          -b 8 -e 64M -f 8 --out runs/r$r-$n >/dev/null
    done; done
    python3 scripts/worst_ratios.py runs/* --peer ompi
"""
import argparse
import collections
import glob
import json
import os
import re
import statistics


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", help="--out folders of run_benchmarks.py")
    ap.add_argument("--peer", default="ompi", help="gloo or ompi (default ompi)")
    ap.add_argument("--transport", default="auto", help="shoal's transport in the file names (default auto)")
    args = ap.parse_args()

    ratios = collections.defaultdict(list)  # (op, ranks, bytes) -> [peer/shoal per run]
    pattern = re.compile(rf"^([a-z_]+)-(\d+)-{re.escape(args.transport)}-vs-{re.escape(args.peer)}\.json$")
    for d in args.dirs:
        for f in glob.glob(os.path.join(d, "*.json")):
            m = pattern.match(os.path.basename(f))
            if not m:
                continue
            op, ranks = m.group(1), int(m.group(2))
            for row in json.load(open(f))["rows"]:
                shoal, peer = row.get("shoal_us"), row.get(f"{args.peer}_us")
                if shoal and peer:
                    ratios[(op, ranks, row["bytes"])].append(peer / shoal)
    if not ratios:
        raise SystemExit(f"no rows against {args.peer} in {args.dirs}")

    print(f"| op | ranks | worst median {args.peer}/shoal (runs' range) | sizes with a median below 1.0 | runs |")
    print("|---|---:|---|---|---:|")
    for op in sorted({k[0] for k in ratios}):
        for ranks in sorted({k[1] for k in ratios if k[0] == op}):
            cells = sorted((k[2], ratios[k]) for k in ratios if k[0] == op and k[1] == ranks)
            meds = [(statistics.median(v), size, min(v), max(v), len(v)) for size, v in cells]
            worst = min(meds)
            below = "; ".join(f"{human(s)}: {m:.2f} ({lo:.2f}-{hi:.2f})" for m, s, lo, hi, _ in meds if m < 1.0)
            print(f"| {op} | {ranks} | {worst[0]:.2f} at {human(worst[1])} ({worst[2]:.2f}-{worst[3]:.2f}) "
                  f"| {below or '-'} | {min(n for *_, n in meds)} |")


def human(n):
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n} B" if n else "0"


if __name__ == "__main__":
    main()
