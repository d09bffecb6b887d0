#!/usr/bin/env python3
"""Measure every algorithm of an op at every size, to set the automatic choice.

    python3 scripts/tune_algos.py allreduce --ranks 4 --transport tcp --algos mst,bde,ring

Runs build/shoal-bench once per algorithm (plus auto) over the same sizes (--rounds times, the
medians) and prints one table: time in µs per algorithm, the fastest marked with '*', and what
auto chose (its time). Then, for each switch of the automatic choice (src/algo/cost.h, Switch)
between algorithms measured, the line `switch NAME@RANKS BYTES` that SHOAL_TUNING reads (it holds
for groups of that many ranks; a line without @RANKS, written by hand, for any size): the switches
of a chain (mst, then bde, then ring) are placed where the chain loses least against the fastest
algorithm at each size measured (the sum of log(time / fastest)), each halfway (geometrically)
between two sizes measured; `never` past the largest, 0 before the smallest (docs/algorithms.md,
"Where the choice changes").

    python3 scripts/tune_algos.py --direct [--direct-ops allreduce,reduce,alltoall,alltoallv,broadcast,allgather,scatter,gather]
        [--ranks-list 2,3,4,8,16] [--rounds 7] [-b 16K -e 4M -f 2] [--out FILE]

Times both ways of each op that has two on one host (src/algo/cost.h: the allreduce and reduce
in one shot or two, SHOAL_DIRECT_REDUCE; alltoall and alltoallv through the scratch slots or the
rings, SHOAL_DIRECT_ALLTOALL; broadcast, allgather, scatter and gather through the scratch or by
single copy, SHOAL_DIRECT_BROADCAST, _ALLGATHER, _SCATTER and _GATHER) at each group size and message size, rounds outermost, and prints the
medians in the format SHOAL_TUNING reads; --out adds them to FILE (in place of its lines for the
same points). The built-in points, src/algo/cost_points.inc (AMD) and cost_points_intel.inc (Intel), are such files. A round runs both ways of an op and group size back to
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


def run(bench, op, ranks, algo, env, transport, lo, hi, factor, iters, floors=False, hosts=None, layout=None):
    """{bytes: µs}, and with `floors` the cache-line round trip (ns) measured just before. With
    `hosts` (scripts/netns_hosts.py), rank r runs on fake host layout[r] (default: a host each)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [bench, op, "-n", str(ranks), "-b", lo, "-e", hi, "-f", str(factor), "--algo", algo,
           "--transport", transport, "--check", "--json", path]
    if iters:
        cmd += ["--iters", str(iters)]
    if floors:
        cmd += ["--floors"]
    if hosts is not None:
        import netns_hosts as nh
        os.chmod(path, 0o666)
        res = nh.run_job(hosts, layout or list(range(ranks)), cmd, env=dict(os.environ, **(env or {})),
                         store_bin=os.path.join(os.path.dirname(bench), "shoal-store"), timeout=900)
        if not res.ok:
            sys.exit(f"{' '.join(cmd)} failed\n{res.describe()}")
    else:
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
# direct allreduce and reduce in one shot or two, alltoall(v) through the scratch slots (or
# single copy) or by the pairwise exchange over the shm rings, and broadcast, allgather, scatter and gather through
# the scratch or by single copy.
WAYS = {
    "allreduce": {0: ("direct", {"SHOAL_DIRECT_REDUCE": "one_shot"}), 1: ("direct", {"SHOAL_DIRECT_REDUCE": "two_shot"})},
    "reduce": {0: ("direct", {"SHOAL_DIRECT_REDUCE": "one_shot"}), 1: ("direct", {"SHOAL_DIRECT_REDUCE": "two_shot"})},
    "alltoall": {0: ("direct", {"SHOAL_DIRECT_ALLTOALL": "scratch"}), 1: ("direct", {"SHOAL_DIRECT_ALLTOALL": "pairwise"})},
    "alltoallv": {0: ("direct", {"SHOAL_DIRECT_ALLTOALL": "scratch"}), 1: ("direct", {"SHOAL_DIRECT_ALLTOALL": "pairwise"})},
    "broadcast": {0: ("direct", {"SHOAL_DIRECT_BROADCAST": "scratch"}), 1: ("direct", {"SHOAL_DIRECT_BROADCAST": "single_copy"})},
    "allgather": {0: ("direct", {"SHOAL_DIRECT_ALLGATHER": "scratch"}), 1: ("direct", {"SHOAL_DIRECT_ALLGATHER": "single_copy"})},
    "scatter": {0: ("direct", {"SHOAL_DIRECT_SCATTER": "scratch"}), 1: ("direct", {"SHOAL_DIRECT_SCATTER": "single_copy"})},
    "gather": {0: ("direct", {"SHOAL_DIRECT_GATHER": "scratch"}), 1: ("direct", {"SHOAL_DIRECT_GATHER": "single_copy"})},
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
    emit(out_lines, a.out)


# The switches of the automatic choice over the network (cost.h), as chains: an op's algorithms
# in the order the choice takes them as the size grows, and the switch between each and the next
# (None: that switch is set by another chain). (op, where, algorithms, switches); where: pow2 or
# odd (group sizes), hosts (--hosts) or one_host (--transport tcp: every rank on this host).
CHAINS = [
    ("allreduce", "pow2", ["mst", "bde", "ring"], ["allreduce.mst_below", "allreduce.bde_up_to"]),
    ("allreduce", "odd", ["mst", "bde", "ring"], [None, "allreduce.bde_up_to_odd_p"]),
    ("broadcast", "hosts", ["mst", "scatter_allgather"], ["broadcast.mst_below"]),
    ("broadcast", "one_host", ["mst", "linear", "ring"], ["broadcast.one_host.mst_below", "broadcast.chain_from"]),
    ("reduce", "any", ["mst", "ring"], ["reduce.mst_below"]),
    ("allgather", "any", ["rd", "ring"], ["allgather.rd_below"]),
    ("reduce_scatter", "pow2", ["rd", "ring"], ["reduce_scatter.halving_below"]),
    ("reduce_scatter", "odd", ["rd", "ring"], ["reduce_scatter.halving_below_odd_p"]),
    ("gather", "any", ["mst", "linear"], ["gather.mst_below"]),
    ("scatter", "any", ["mst", "linear"], ["scatter.mst_below"]),
]


def chain_cuts(sizes, times):
    """The cuts (indices into `sizes`: algorithm k runs from sizes[cut[k-1]]) that lose least
    against the fastest of the chain at each size, summed over the sizes as log(time / fastest)."""
    import itertools
    import math
    k = len(times)
    best = None
    for cuts in itertools.combinations_with_replacement(range(len(sizes) + 1), k - 1):
        loss = 0.0
        for i, n in enumerate(sizes):
            a = sum(1 for c in cuts if c <= i)  # the algorithm that runs at sizes[i]
            loss += math.log(times[a][n] / min(t[n] for t in times))
        if best is None or loss < best[0] - 1e-12:
            best = (loss, cuts)
    return best[1]


def switch_value(sizes, cut):
    """A cut before sizes[cut] as a switch: halfway (geometrically) between the sizes around it."""
    if cut == 0:
        return 0
    if cut == len(sizes):
        return "never"
    return round((sizes[cut - 1] * sizes[cut]) ** 0.5)


def switch_lines(op, ranks, res, sizes, hosts):
    pow2 = ranks & (ranks - 1) == 0
    out = []
    for cop, which, algos, names in CHAINS:
        if cop != op or any(al not in res for al in algos):
            continue
        if (which == "pow2" and not pow2) or (which == "odd" and pow2):
            continue
        if (which == "hosts" and not hosts) or (which == "one_host" and hosts):
            continue
        cuts = chain_cuts(sizes, [res[al] for al in algos])
        out += [f"switch {name}@{ranks} {switch_value(sizes, c)}" for name, c in zip(names, cuts) if name]
    return out


# The forms of the hierarchical algorithms (hierarchical.cpp), each forced by a tuning file that
# puts its switch before every size (0) or past every size (never): op -> (switch, forms).
HIER = {
    "allreduce": ("hier.allreduce.split_from", ["leader", "split"]),
    "broadcast": ("hier.broadcast.chain_from", ["tree", "chain"]),
    "allgather": ("hier.allgather.ring_from", ["leader", "ring"]),
}


def fake_hosts(n):
    """n fake hosts (scripts/netns_hosts.py), or exit: they need root."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import netns_hosts as nh
    ok, why = nh.available()
    if not ok:
        sys.exit(f"fake hosts: {why}")
    return nh.FakeHosts(n)


def table(title, names, res, sizes):
    print(title)
    print("# " + " ".join(f"{x:>12}" for x in ["bytes"] + names))
    for n in sizes:
        best = min(res[x][n] for x in names if x != "auto")
        print("# " + f"{n:>12} " + " ".join(f"{res[x][n]:>11.1f}{'*' if res[x][n] == best and x != 'auto' else ' '}"
                                           for x in names))


def emit(lines, out):
    """Prints `lines` and adds them to the file `out`, where they replace the lines of the same
    switch or point (a file has one of each); in a built-in points file (src/algo/cost_points*.inc:
    a C++ raw string), before its closing `)"`."""
    print("\n".join(lines))
    if not out:
        return
    def key(line):  # "switch NAME[@RANKS]" or "direct OP RANKS BYTES"
        w = line.split()
        return " ".join(w[:2] if w[0] == "switch" else w[:4])
    new = {key(x) for x in lines}
    old = []
    if os.path.exists(out):
        with open(out) as f:
            old = [x.rstrip("\n") for x in f if not (x.split() and x.split()[0] in ("switch", "direct") and key(x) in new)]
    tail = []
    while old and old[-1].strip() in ("", ')"'):
        tail.insert(0, old.pop())
    if ')"' not in [x.strip() for x in tail]:
        tail = []
    with open(out, "w") as f:
        f.write("\n".join(old + lines + tail) + "\n")


def tune_hier(a):
    """Both forms of each hierarchical op (--hier-ops) on fake hosts laid out as --layout."""
    layout = [int(x) for x in a.layout.split(",")]
    ops = a.hier_ops.split(",")
    runs = {op: {form: [] for form in HIER[op][1]} for op in ops}
    with fake_hosts(max(layout) + 1) as hosts, tempfile.TemporaryDirectory(prefix="shoal-tune-") as tmp:
        os.chmod(tmp, 0o755)
        for _ in range(a.rounds):
            for op in ops:
                name, forms = HIER[op]
                for k, form in enumerate(forms):
                    path = os.path.join(tmp, f"{op}-{form}.txt")
                    with open(path, "w") as f:
                        f.write(f"switch {name} {'never' if k == 0 else 0}\n")
                    os.chmod(path, 0o644)
                    runs[op][form].append(run(a.bench, op, len(layout), "hier", {"SHOAL_TUNING": path}, "auto",
                                              a.b, a.e, a.f, a.iters, hosts=hosts, layout=layout))
    for op in ops:
        name, forms = HIER[op]
        sizes = sorted(runs[op][forms[0]][0])
        res = {form: {n: sorted(r[n] for r in rs)[len(rs) // 2] for n in sizes} for form, rs in runs[op].items()}
        print(f"# scripts/tune_algos.py --hier --hier-ops {op} --layout {a.layout} --rounds {a.rounds} "
              f"-b {a.b} -e {a.e} -f {a.f}")
        table(f"# {op} (hier) on fake hosts {a.layout}: time (us) per form, median of {a.rounds}, * = fastest",
              forms, res, sizes)
        cuts = chain_cuts(sizes, [res[form] for form in forms])
        emit([f"switch {name}@{len(layout)} {switch_value(sizes, cuts[0])}"], a.out)


def tune_op(a):
    """Every algorithm of one op (--algos), and the switches between them."""
    algos = a.algos.split(",") + ["auto"]
    hosts = fake_hosts(a.ranks) if a.hosts else None
    # Rounds outermost, algorithms interleaved in each: a slow stretch of the machine then falls
    # on every algorithm, not on one.
    runs = {al: [] for al in algos}
    try:
        if hosts:
            hosts.up()
        for _ in range(a.rounds):
            for al in algos:
                runs[al].append(run(a.bench, a.op, a.ranks, al, {}, "auto" if hosts else a.transport,
                                    a.b, a.e, a.f, a.iters, hosts=hosts))
    finally:
        if hosts:
            hosts.down()
    sizes = sorted(runs[algos[0]][0])
    res = {al: {n: sorted(r[n] for r in rs)[len(rs) // 2] for n in sizes} for al, rs in runs.items()}
    where = "--hosts" if hosts else f"--transport {a.transport}"
    print(f"# scripts/tune_algos.py {a.op} --ranks {a.ranks} {where} --algos {a.algos} "
          f"--rounds {a.rounds} -b {a.b} -e {a.e} -f {a.f}")
    table(f"# {a.op}, {a.ranks} ranks, {'a fake host each' if hosts else 'transport ' + a.transport}: "
          f"time (us) per algorithm, median of {a.rounds}, * = fastest", algos, res, sizes)
    emit(switch_lines(a.op, a.ranks, res, sizes, hosts is not None), a.out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("op", nargs="?")
    ap.add_argument("--direct", action="store_true", help="measure both ways of the direct ops (--direct-ops)")
    ap.add_argument("--direct-ops", default="allreduce,reduce,alltoall,alltoallv,broadcast,allgather,scatter,gather")
    ap.add_argument("--ranks-list", default="2,3,4,8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", help="add the points or switches to this file (replacing its lines for the same ones)")
    ap.add_argument("--raw", help="with --direct: also write every run's times to this JSON file")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--hosts", action="store_true",
                    help="OP: each rank on a fake host of its own (scripts/netns_hosts.py; needs root)")
    ap.add_argument("--hier", action="store_true", help="measure both forms of the hierarchical ops (--hier-ops)")
    ap.add_argument("--hier-ops", default="allreduce,broadcast,allgather")
    ap.add_argument("--layout", default="0,0,1,1", help="--hier: the fake host of each rank")
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
    if a.hier:
        return tune_hier(a)
    if not a.op or not a.algos:
        ap.error("give an OP and --algos, or --direct, or --hier")
    tune_op(a)


if __name__ == "__main__":
    main()
