#!/usr/bin/env python3
"""Where the scheduler put the ranks of one shoal-bench run, and how often each handed its core over.

With more ranks than cores, a small op's time follows the split of ranks over the cores: every rank
runs in every op, so the core with the most ranks sets the pace. This runs

    build/shoal-bench OP -n N -b SIZE -e SIZE --iters ITERS --json FILE

`--runs` times and, while each runs, reads every rank's /proc/PID/stat (the CPU it is queued on)
and /proc/PID/status (its context switches a yield or preemption forced) every few milliseconds.
Per run it prints the op's time, how many ranks each CPU held (each rank counted on the CPU it
was seen on most), and per CPU the hand-overs per op of its ranks (forced switches over ops run
while sampled):

    python3 scripts/rank_placement.py allreduce -n 8 -b 8 --runs 6

With `--pin K` it pins the first K ranks it finds (in the order the launcher made them) to the
first CPU this script may use and the others to the second, as soon as they exist: the op's time
for a split chosen rather than drawn (`--pin 4`, `--pin 5`, `--pin 6` with 8 ranks on 2 cores).
"""
import argparse
import collections
import json
import os
import subprocess
import tempfile
import time

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "shoal-bench")


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def sample(pid):
    """(cpu, forced switches) of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            cpu = int(f.read().rsplit(")", 1)[1].split()[36])  # field 39
        with open(f"/proc/{pid}/status") as f:
            forced = next(int(l.split()[1]) for l in f if l.startswith("nonvoluntary_ctxt_switches"))
        return cpu, forced
    except (OSError, StopIteration, IndexError, ValueError):
        return None


def one_run(args):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [args.bench, args.op, "-n", str(args.ranks), "-b", args.size, "-e", args.size, "--iters",
               str(args.iters), "--json", out.name]
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ranks = []
        while p.poll() is None and len(ranks) < args.ranks:
            ranks = children(p.pid)
            time.sleep(0.002)
        if args.pin is not None:
            cpus = sorted(os.sched_getaffinity(0))[:2]
            for i, r in enumerate(ranks):
                try:
                    os.sched_setaffinity(r, {cpus[0] if i < args.pin else cpus[-1]})
                except OSError:
                    pass  # already gone
        time.sleep(args.settle)  # past the group's creation and the warmup
        seen = {r: collections.Counter() for r in ranks}
        first, last = {}, {}
        t0 = time.monotonic()
        while p.poll() is None and time.monotonic() - t0 < args.window:
            for r in ranks:
                s = sample(r)
                if s:
                    seen[r][s[0]] += 1
                    first.setdefault(r, s[1])
                    last[r] = s[1]
            time.sleep(0.005)
        window = time.monotonic() - t0
        p.wait()
        row = json.load(open(out.name))["rows"][0]
    us = row.get("shoal_us")
    ops = window * 1e6 / us if us else 0
    per_cpu = collections.defaultdict(list)
    for r in ranks:
        if seen[r]:
            per_cpu[seen[r].most_common(1)[0][0]].append((last[r] - first[r]) / ops if ops else 0)
    split = " / ".join(f"cpu{c}: {len(v)}" for c, v in sorted(per_cpu.items()))
    handovers = "; ".join(f"cpu{c}: " + " ".join(f"{x:.1f}" for x in sorted(v)) for c, v in sorted(per_cpu.items()))
    return us, split, handovers


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("op")
    ap.add_argument("-n", "--ranks", type=int, default=8)
    ap.add_argument("-b", "--size", default="8")
    ap.add_argument("--iters", type=int, default=200000)
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--settle", type=float, default=0.3, help="seconds before sampling starts (default 0.3)")
    ap.add_argument("--window", type=float, default=0.5, help="seconds sampled (default 0.5)")
    ap.add_argument("--pin", type=int, help="pin the first PIN ranks to one CPU, the others to a second")
    ap.add_argument("--bench", default=BENCH)
    args = ap.parse_args()
    print(f"| run | {args.op} {args.size} B, {args.ranks} ranks: µs per op | ranks per CPU | hand-overs per op of each rank |")
    print("|---:|---:|---|---|")
    for i in range(args.runs):
        us, split, handovers = one_run(args)
        print(f"| {i + 1} | {us:.2f} | {split} | {handovers} |")


if __name__ == "__main__":
    main()
