#!/usr/bin/env python3
"""Run shoal-bench against its peers for every op and write BENCHMARKS.md's tables and plots.

    .venv/bin/python scripts/run_benchmarks.py --ranks 4 --out bench-results
    .venv/bin/python scripts/run_benchmarks.py --ranks 2 --vs ompi --transports auto -b 8 -e 64M -f 8

For each op (and each transport: shoal's automatic choice, then forced TCP) this runs
`build/shoal-bench OP -n RANKS -b 4K -e 64M -f 4 --check --vs PEERS --json ...` (PEERS: gloo by
default; ompi for Open MPI, or both), keeps the JSON under --out, draws busbw against size for
shoal and each peer (one PNG per op), and prints a markdown section per op with time, busbw and
the ratio peer/shoal for every size, and the worst ratio of each peer over the sizes. The
commands it ran are printed with the tables, so every figure can be reproduced.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS = ["allreduce", "allgather", "broadcast", "reduce", "reduce_scatter", "gather", "scatter",
       "alltoall", "sendrecv", "barrier"]


def human(n):
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def plot(results, path, title, peers):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, res in results:
        rows = [r for r in res["rows"] if r["bytes"] > 0]
        xs = [r["bytes"] for r in rows]
        ax.plot(xs, [r["shoal_busbw"] for r in rows], marker="o", label=f"shoal ({label})")
        if label == results[0][0]:
            for peer, marker in zip(peers, "s^v"):
                ax.plot(xs, [r.get(f"{peer}_busbw") or 0 for r in rows], marker=marker, label=peer)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def num(v, fmt):
    return "-" if v is None else format(v, fmt)


def table(res, peers):
    head = "| bytes | shoal µs | shoal busbw |"
    rule = "|---:|---:|---:|"
    for p in peers:
        head += f" {p} µs | {p} busbw | {p}/shoal time |"
        rule += "---:|---:|---:|"
    out = [head + " check |", rule + "---|"]
    for r in res["rows"]:
        line = f"| {human(r['bytes'])} | {num(r['shoal_us'], '.1f')} | {num(r.get('shoal_busbw'), '.3f')} |"
        for p in peers:
            line += f" {num(r.get(f'{p}_us'), '.1f')} | {num(r.get(f'{p}_busbw'), '.3f')} | {num(r.get(f'{p}_ratio'), '.2f')} |"
        checks = [r.get("check", "")] + [r.get(f"{p}_check", "") for p in peers]
        out.append(line + f" {'ok' if all(c == 'ok' for c in checks) else ', '.join(checks)} |")
    for p in peers:
        ratios = [(r[f"{p}_ratio"], r["bytes"]) for r in res["rows"] if r.get(f"{p}_ratio") is not None]
        if ratios:
            worst = min(ratios)
            out.append(f"\nWorst {p}/shoal time: {worst[0]:.2f} at {human(worst[1])}.")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--transports", default="auto,tcp")
    ap.add_argument("-b", default="4K")
    ap.add_argument("-e", default="64M")
    ap.add_argument("-f", default="4")
    ap.add_argument("--vs", default="gloo", help="peers: gloo, ompi or gloo,ompi")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bench"))
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "shoal-bench"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    peers = a.vs.split(",")
    suffix = "" if peers == ["gloo"] else "-vs-" + "-".join(peers)  # files of the gloo tables keep their names
    for op in a.ops.split(","):
        runs = []
        print(f"\n### {op}, {a.ranks} ranks, f32\n")
        for tr in a.transports.split(","):
            path = os.path.join(a.out, f"{op}-{a.ranks}-{tr}{suffix}.json")
            lo, hi = ("0", "0") if op == "barrier" else (a.b, a.e)
            cmd = [a.bench, op, "-n", str(a.ranks), "-b", lo, "-e", hi, "-f", a.f, "--transport", tr,
                   "--check", "--vs", a.vs, "--json", path]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            with open(path) as f:
                res = json.load(f)
            runs.append((tr, res))
            shown = " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in cmd[:-2])
            print(f"`{shown}` (shoal: {res.get('transport_used', tr)}):\n")
            print(table(res, peers) + "\n")
        if op != "barrier":
            png = os.path.join(a.out, f"{op}-{a.ranks}{suffix}.png")
            plot(runs, png, f"{op}, {a.ranks} ranks, f32", peers)
            print(f"![{op}]({os.path.relpath(png, ROOT)})\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
