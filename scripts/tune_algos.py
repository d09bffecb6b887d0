#!/usr/bin/env python3
"""Measure every algorithm of an op at every size, to set the automatic choice.

    python3 scripts/tune_algos.py allreduce --ranks 4 --transport tcp --algos mst,bde,ring

Runs build/shoal-bench once per algorithm (plus auto) over the same sizes and prints one table:
time in µs per algorithm, the fastest marked with '*', and what auto chose (its time). The
thresholds in src/algo/select.cpp and the table in docs/algorithms.md come from these runs.

    python3 scripts/tune_algos.py --direct [--direct-ops allreduce,reduce,alltoall]
        [--ranks-list 2,3,4,8,16] [--rounds 7] [-b 16K -e 4M -f 2] [--out FILE]

Times both ways of each op that has two on one host (src/algo/cost.h: the allreduce and reduce
in one shot or two, SHOAL_DIRECT_REDUCE; alltoall through the scratch slots or the rings,
SHOAL_DIRECT_ALLTOALL) at each group size and message size, rounds outermost, and prints the
medians in the format SHOAL_TUNING reads; --out writes them to FILE. The built-in points,
src/algo/cost_points.inc, are such files.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(bench, op, ranks, algo, env, transport, lo, hi, factor, iters):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [bench, op, "-n", str(ranks), "-b", lo, "-e", hi, "-f", str(factor), "--algo", algo,
           "--transport", transport, "--check", "--json", path]
    if iters:
        cmd += ["--iters", str(iters)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, **(env or {})))
    with open(path) as f:
        rows = json.load(f)["rows"]
    os.unlink(path)
    for r in rows:
        if r.get("check", "ok") != "ok":
            sys.exit(f"{op} {algo}: check failed at {r['bytes']} bytes: {r['check']}")
    return {r["bytes"]: r["shoal_us"] for r in rows}


# The two ways of each op on one host, as the bench runs them (algorithm, environment): the
# direct allreduce and reduce in one shot or two, and alltoall through the scratch slots (or
# single copy) or by the pairwise exchange over the shm rings.
WAYS = {
    "allreduce": {0: ("direct", {"SHOAL_DIRECT_REDUCE": "one_shot"}), 1: ("direct", {"SHOAL_DIRECT_REDUCE": "two_shot"})},
    "reduce": {0: ("direct", {"SHOAL_DIRECT_REDUCE": "one_shot"}), 1: ("direct", {"SHOAL_DIRECT_REDUCE": "two_shot"})},
    "alltoall": {0: ("direct", {"SHOAL_DIRECT_ALLTOALL": "scratch"}), 1: ("direct", {"SHOAL_DIRECT_ALLTOALL": "pairwise"})},
}


def tune_direct(a):
    ways = [0, 1]
    out_lines = ["# scripts/tune_algos.py --direct --direct-ops %s --ranks-list %s --rounds %d -b %s -e %s"
                 % (a.direct_ops, a.ranks_list, a.rounds, a.b, a.e),
                 "# direct OP RANKS BYTES WAY0_US WAY1_US (medians; src/algo/cost.h names the ways)"]
    ops, ranks = a.direct_ops.split(","), [int(x) for x in a.ranks_list.split(",")]
    # Rounds outermost: this machine's speed between cores changes for minutes at a time
    # (BENCHMARKS.md, "Near and far cores"), so every group size gets runs from every stretch.
    times = {(op, p, w): {} for op in ops for p in ranks for w in ways}
    for rnd in range(a.rounds):
        for op in ops:
            for p in ranks:
                for w in (ways if rnd % 2 == 0 else ways[::-1]):
                    got = run(a.bench, op, p, *WAYS[op][w], "shm", a.b, a.e, a.f, a.iters)
                    for n, t in got.items():
                        times[(op, p, w)].setdefault(n, []).append(t)
    for op in ops:
        for p in ranks:
            med = {w: {n: sorted(ts)[len(ts) // 2] for n, ts in times[(op, p, w)].items()} for w in ways}
            print(f"# {op}, {p} ranks: median us of {a.rounds} rounds (* = faster)")
            for n in sorted(med[0]):
                t1, t2 = med[0][n], med[1][n]
                print(f"#   {n:>10}  way 0 {t1:9.1f}{'*' if t1 <= t2 else ' '}  way 1 {t2:9.1f}{'*' if t2 < t1 else ' '}")
                out_lines.append(f"direct {op} {p} {n} {t1:.1f} {t2:.1f}")
    text = "\n".join(out_lines) + "\n"
    print(text, end="")
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("op", nargs="?")
    ap.add_argument("--direct", action="store_true", help="measure both ways of the direct ops (--direct-ops)")
    ap.add_argument("--direct-ops", default="allreduce,reduce,alltoall")
    ap.add_argument("--ranks-list", default="2,3,4,8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--algos", help="comma-separated, e.g. mst,bde,ring")
    ap.add_argument("-b", default="4K")
    ap.add_argument("-e", default="64M")
    ap.add_argument("-f", type=int, default=4)
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "shoal-bench"))
    a = ap.parse_args()
    if a.direct:
        if a.b == "4K" and a.e == "64M":
            a.b, a.e, a.f = "16K", "4M", 2
        return tune_direct(a)
    if not a.op or not a.algos:
        ap.error("give an OP and --algos, or --direct")
    algos = a.algos.split(",") + ["auto"]
    res = {al: run(a.bench, a.op, a.ranks, al, {}, a.transport, a.b, a.e, a.f, a.iters) for al in algos}
    sizes = sorted(res[algos[0]])
    print(f"# {a.op}, {a.ranks} ranks, transport {a.transport}: time (us) per algorithm, * = fastest")
    print("# " + " ".join(f"{x:>12}" for x in ["bytes"] + algos))
    for s in sizes:
        best = min(res[al][s] for al in algos[:-1])
        cells = [f"{res[al][s]:>11.1f}{'*' if res[al][s] == best and al != 'auto' else ' '}" for al in algos]
        print("  " + f"{s:>12} " + " ".join(cells))


if __name__ == "__main__":
    main()
