#!/usr/bin/env python3
"""Measure every algorithm of an op at every size, to set the thresholds of the automatic choice.

    python3 scripts/tune_algos.py allreduce --ranks 4 --transport tcp --algos mst,bde,ring

Runs build/shoal-bench once per algorithm (plus auto) over the same sizes and prints one table:
time in µs per algorithm, the fastest marked with '*', and what auto chose (its time). The
thresholds in src/algo/select.cpp and the table in docs/algorithms.md come from these runs.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(bench, op, ranks, algo, transport, lo, hi, factor, iters):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [bench, op, "-n", str(ranks), "-b", lo, "-e", hi, "-f", str(factor), "--algo", algo,
           "--transport", transport, "--check", "--json", path]
    if iters:
        cmd += ["--iters", str(iters)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(path) as f:
        rows = json.load(f)["rows"]
    os.unlink(path)
    for r in rows:
        if r.get("check", "ok") != "ok":
            sys.exit(f"{op} {algo}: check failed at {r['bytes']} bytes: {r['check']}")
    return {r["bytes"]: r["shoal_us"] for r in rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("op")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--algos", required=True, help="comma-separated, e.g. mst,bde,ring")
    ap.add_argument("-b", default="4K")
    ap.add_argument("-e", default="64M")
    ap.add_argument("-f", type=int, default=4)
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "shoal-bench"))
    a = ap.parse_args()
    algos = a.algos.split(",") + ["auto"]
    res = {al: run(a.bench, a.op, a.ranks, al, a.transport, a.b, a.e, a.f, a.iters) for al in algos}
    sizes = sorted(res[algos[0]])
    print(f"# {a.op}, {a.ranks} ranks, transport {a.transport}: time (us) per algorithm, * = fastest")
    print("# " + " ".join(f"{x:>12}" for x in ["bytes"] + algos))
    for s in sizes:
        best = min(res[al][s] for al in algos[:-1])
        cells = [f"{res[al][s]:>11.1f}{'*' if res[al][s] == best and al != 'auto' else ' '}" for al in algos]
        print("  " + f"{s:>12} " + " ".join(cells))


if __name__ == "__main__":
    main()
