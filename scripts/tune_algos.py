#!/usr/bin/env python3
"""Measure every algorithm of an op at every size, to set the automatic choice.

    python3 scripts/tune_algos.py allreduce --ranks 4 --transport tcp --algos mst,bde,ring

Runs build/shoal-bench once per algorithm (plus auto) over the same sizes and prints one table:
time in µs per algorithm, the fastest marked with '*', and what auto chose (its time). The
thresholds in src/algo/select.cpp and the table in docs/algorithms.md come from these runs.

    python3 scripts/tune_algos.py --direct [--direct-ops allreduce,reduce,alltoall,alltoallv]
        [--ranks-list 2,3,4,8,16] [--rounds 7] [-b 16K -e 4M -f 2] [--out FILE]

Times both ways of each op that has two on one host (src/algo/cost.h: the allreduce and reduce
in one shot or two, SHOAL_DIRECT_REDUCE; alltoall and alltoallv through the scratch slots or the
rings, SHOAL_DIRECT_ALLTOALL) at each group size and message size, rounds outermost, and prints the
medians in the format SHOAL_TUNING reads; --out writes them to FILE. The built-in points,
src/algo/cost_points.inc, are such files. A round runs both ways of an op and group size back to
back; each point holds two rounds' pairs, the round least favourable to way 0 and the one least
favourable to way 1 (the second worst of five or more), so that the choice (src/algo/cost.h) is
the way that loses least in the worse of the machine's stretches (near and far cores).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(bench, op, ranks, algo, env, transport, lo, hi, factor, iters, floors=False):
    """{bytes: µs}, and with `floors` the cache-line round trip (ns) measured just before."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [bench, op, "-n", str(ranks), "-b", lo, "-e", hi, "-f", str(factor), "--algo", algo,
           "--transport", transport, "--check", "--json", path]
    if iters:
        cmd += ["--iters", str(iters)]
    if floors:
        cmd += ["--floors"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, **(env or {})))
    with open(path) as f:
        doc = json.load(f)
    os.unlink(path)
    rows = doc["rows"]
    for r in rows:
        if r.get("check", "ok") != "ok":
            sys.exit(f"{op} {algo}: check failed at {r['bytes']} bytes: {r['check']}")
    times = {r["bytes"]: r["shoal_us"] for r in rows}
    return (times, doc["floors"]["cacheline_rtt_ns"]) if floors else times


# The two ways of each op on one host, as the bench runs them (algorithm, environment): the
# direct allreduce and reduce in one shot or two, and alltoall(v) through the scratch slots (or
# single copy) or by the pairwise exchange over the shm rings.
WAYS = {
    "allreduce": {0: ("direct", {"SHOAL_DIRECT_REDUCE": "one_shot"}), 1: ("direct", {"SHOAL_DIRECT_REDUCE": "two_shot"})},
    "reduce": {0: ("direct", {"SHOAL_DIRECT_REDUCE": "one_shot"}), 1: ("direct", {"SHOAL_DIRECT_REDUCE": "two_shot"})},
    "alltoall": {0: ("direct", {"SHOAL_DIRECT_ALLTOALL": "scratch"}), 1: ("direct", {"SHOAL_DIRECT_ALLTOALL": "pairwise"})},
    "alltoallv": {0: ("direct", {"SHOAL_DIRECT_ALLTOALL": "scratch"}), 1: ("direct", {"SHOAL_DIRECT_ALLTOALL": "pairwise"})},
}


def parse_size(s):
    """'16K', '16KiB', '16KB' -> 16384, as shoal-bench reads sizes."""
    m = re.fullmatch(r"([0-9.]+)\s*([KMG]?)(i?B)?", s.strip(), re.IGNORECASE)
    if not m:
        sys.exit(f"not a size: {s!r}")
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()])


def same_state(r0, r1):
    """Whether two runs started in one state: round trips within 2x (None: not measured, fewer
    than two CPUs, where there is no such state to tell)."""
    return r0 is None or r1 is None or max(r0, r1) < 2 * min(r0, r1)


def adverse(pairs, way):
    """Of the rounds' (way 0, way 1) pairs, the one where `way` lost most to the other: the
    second worst when there are five or more, so that one disturbed run does not decide."""
    ranked = sorted(pairs, key=lambda t: t[way] / max(t[1 - way], 1e-9), reverse=True)
    return ranked[1] if len(ranked) >= 5 else ranked[0]


def tune_direct(a):
    ways = [0, 1]
    ops, ranks = a.direct_ops.split(","), [int(x) for x in a.ranks_list.split(",")]
    # Rounds outermost, and in each round both ways of one op and group size back to back: this
    # machine's speed between cores changes for minutes at a time (BENCHMARKS.md, "Near and far
    # cores"), and can favour one way in one stretch and the other in the next. The two runs of
    # a round compare the ways in one stretch; the rounds cover several.
    if a.f < 2:
        sys.exit("-f must be 2 or more")
    sizes = []
    n, hi = parse_size(a.b), parse_size(a.e)
    while n <= hi:
        sizes.append(n)
        n *= a.f
    # runs[(op, p)][n]: per round, (way 0 µs, way 1 µs, round trip ns before each)
    runs = {(op, p): {n: [] for n in sizes} for op in ops for p in ranks}
    for rnd in range(a.rounds):
        for op in ops:
            for p in ranks:
                for n in sizes:  # one size per run: the two ways of a size run a second apart
                    t, rtt = {}, {}
                    for w in (ways if rnd % 2 == 0 else ways[::-1]):
                        got, rtt[w] = run(a.bench, op, p, *WAYS[op][w], "shm", str(n), str(n), a.f, a.iters, floors=True)
                        t[w] = next(iter(got.values()))  # the bench rounds n to whole blocks
                    runs[(op, p)][n].append((t[0], t[1], rtt[0], rtt[1]))
    if a.raw:
        with open(a.raw, "w") as f:
            json.dump({f"{op} {p}": r for (op, p), r in runs.items()}, f)
    rounds = [r for by_n in runs.values() for rs in by_n.values() for r in rs]
    in_one_state = [r for r in rounds if same_state(*r[2:])]
    rtts = [x for r in rounds for x in r[2:] if x is not None] or [0]
    out_lines = ["# scripts/tune_algos.py --direct --direct-ops %s --ranks-list %s --rounds %d -b %s -e %s -f %d"
                 % (a.direct_ops, a.ranks_list, a.rounds, a.b, a.e, a.f),
                 "# direct OP RANKS BYTES WAY0_US WAY1_US WAY0_US WAY1_US: the rounds least favourable to way 0,",
                 "# then to way 1 (src/algo/cost.h); cache-line round trip between the cores before the runs:",
                 "# %.0f-%.0f ns; %d of %d pairs of runs started in one state" % (
                     min(rtts), max(rtts), len(in_one_state), len(rounds))]
    for op in ops:
        for p in ranks:
            print(f"# {op}, {p} ranks, µs: median of {a.rounds} rounds | the round worst for way 0 | for way 1 (* = faster)")
            for n in sizes:
                # A pair of runs that started in different states (round trips 2x apart) compares
                # nothing: left out, unless that leaves none.
                every = runs[(op, p)][n]
                pairs = [(t0, t1) for t0, t1, r0, r1 in every if same_state(r0, r1)] or [r[:2] for r in every]
                med = tuple(sorted(t[w] for t in pairs)[len(pairs) // 2] for w in ways)
                worst0, worst1 = adverse(pairs, 0), adverse(pairs, 1)
                cells = " | ".join(f"{t[0]:9.1f}{'*' if t[0] <= t[1] else ' '} {t[1]:9.1f}{'*' if t[1] < t[0] else ' '}"
                                   for t in (med, worst0, worst1))
                print(f"#   {n:>10}  {cells}")
                out_lines.append(f"direct {op} {p} {n} {worst0[0]:.1f} {worst0[1]:.1f} {worst1[0]:.1f} {worst1[1]:.1f}")
    text = "\n".join(out_lines) + "\n"
    print(text, end="")
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("op", nargs="?")
    ap.add_argument("--direct", action="store_true", help="measure both ways of the direct ops (--direct-ops)")
    ap.add_argument("--direct-ops", default="allreduce,reduce,alltoall,alltoallv")
    ap.add_argument("--ranks-list", default="2,3,4,8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    ap.add_argument("--raw", help="with --direct: also write every run's times to this JSON file")
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
