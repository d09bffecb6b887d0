"""Many ranks on one host (64 and 128 on a few cores): every op checked, and what a rank costs.

    python3 scripts/many_ranks.py [--ranks 64,128] [--transports shm,tcp] [--ops all]
        [--sizes 4K,64K,1M] [--fake-hosts H] [--out docs/bench/many-ranks.md]

Per rank count and transport, runs `build/shoal-bench barrier -n N --resources` (the group's
construction time, RSS, /dev/shm reserved and mapped, open file descriptors; the barrier's time),
then every op with `--check` at the sizes given (a few iterations each: correctness and cost,
not speed: the ranks outnumber the cores many times over). Prints a markdown table; --out writes
it too. shoal raises its soft RLIMIT_NOFILE itself, up to the hard limit.

--fake-hosts H spreads the ranks round-robin over H network-namespace hosts (scripts/netns_hosts.py,
root): TCP between hosts, and within each host shared memory (shm: SHOAL_TRANSPORT=auto) or TCP
too (tcp).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "build", "shoal-bench")
OPS = ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "gather", "scatter", "alltoall",
       "sendrecv", "barrier"]
RES = re.compile(
    r"init (?P<init>[\d.]+) / (?P<init_max>[\d.]+) s, RSS (?P<rss>[\d.]+) / [\d.]+ MiB \(peak [\d.]+ / (?P<hwm>[\d.]+) MiB\), "
    r"/dev/shm reserved (?P<shm>[\d.]+) / [\d.]+ MiB, mapped (?P<mapped>[\d.]+) / [\d.]+ MiB, fds (?P<fds>[\d.]+) / (?P<fds_max>[\d.]+)")


HOSTS = None  # FakeHosts when --fake-hosts is given


def bench(args, timeout=900):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        t0 = time.monotonic()
        argv = [BENCH, *args, "--json", f.name]
        if HOSTS is None:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
            rc, out, err = p.returncode, p.stdout, p.stderr
        else:  # one process per rank, started on its fake host by the launch contract
            import netns_hosts
            n = int(args[args.index("-n") + 1])
            # shm: shared memory within each host and TCP between them (what "auto" does).
            t = args[args.index("--transport") + 1]
            env = dict(os.environ, SHOAL_TRANSPORT="auto" if t == "shm" else t)
            res = netns_hosts.run_job(HOSTS, [r % HOSTS.n for r in range(n)], argv, env=env,
                                      store_bin=os.path.join(ROOT, "build", "shoal-store"), timeout=timeout)
            rc, out, err = max(res.rcs, key=abs), res.outs[0], "".join(res.errs)
        wall = time.monotonic() - t0
        if rc != 0:
            raise RuntimeError(f"shoal-bench {' '.join(args)} failed ({rc}):\n{out[-2000:]}{err[-2000:]}")
        return json.load(open(f.name)), out, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="64,128")
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--ops", default="all")
    ap.add_argument("--sizes", default="4K,64K,1M")
    ap.add_argument("--fake-hosts", type=int, default=0)
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.fake_hosts:
        global HOSTS
        sys.path.insert(0, os.path.join(ROOT, "scripts"))
        import netns_hosts
        HOSTS = netns_hosts.FakeHosts(a.fake_hosts)
        HOSTS.up()
        try:
            return run(a)
        finally:
            HOSTS.down()
    return run(a)


def run(a) -> int:
    ops = OPS if a.ops == "all" else a.ops.split(",")
    sizes = a.sizes.split(",")
    where = f" --fake-hosts {a.fake_hosts}" if a.fake_hosts else ""
    lines = [
        f"`python3 scripts/many_ranks.py --ranks {a.ranks} --transports {a.transports} --sizes {a.sizes}{where}` "
        f"on {os.cpu_count()} cores.",
        "",
        "Per rank, mean / max over the ranks where two figures are given: the Communicator's construction; "
        "one barrier; resident memory (shared pages counted); its own segment in /dev/shm; every segment "
        "it maps (address space); open file descriptors. Ops checked: every op at every size, each "
        "result against a reference (`--check`).",
        "",
        "| ranks | transport | init (mean / max) | barrier | RSS | /dev/shm reserved | mapped | fds | ops checked | slowest op |",
        "|---:|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    failed = False
    for n in [int(x) for x in a.ranks.split(",")]:
        for t in a.transports.split(","):
            js, out, _ = bench(["barrier", "-n", str(n), "--transport", t, "--iters", "20", "--resources", "--check"])
            m = RES.search(out)
            if not m:
                raise RuntimeError("no resources line in:\n" + out)
            barrier_us = js["rows"][0]["shoal_us"]
            checked, bad, slowest = 0, [], ("", 0.0)
            for op in ops:
                for size in sizes if op != "barrier" else ["0"]:
                    try:
                        js2, _, wall = bench([op, "-n", str(n), "--transport", t, "-b", size, "--check",
                                              "--iters", "3", "--warmup", "1"])
                    except RuntimeError as e:
                        bad.append(f"{op} {size}: {str(e).splitlines()[0]}")
                        continue
                    for row in js2["rows"]:
                        if row.get("check") == "ok":
                            checked += 1
                        elif "skipped" not in json.dumps(row):
                            bad.append(f"{op} {size}: {row.get('check')}")
                        if row.get("shoal_us") and row["shoal_us"] > slowest[1]:
                            slowest = (f"{op} {size}", row["shoal_us"])
                    print(f"  {n} {t} {op} {size}: {wall:.1f} s", file=sys.stderr, flush=True)
            failed = failed or bool(bad)
            label = "shm + tcp between hosts" if HOSTS is not None and t == "shm" else t
            lines.append(
                f"| {n} | {label} | {float(m['init']):.2f} / {float(m['init_max']):.2f} s | {barrier_us / 1000:.1f} ms "
                f"| {float(m['rss']):.1f} MiB | {float(m['shm']):.1f} MiB | {float(m['mapped']):.0f} MiB "
                f"| {m['fds_max']} | {checked} ok" + (f", FAILED: {'; '.join(bad)}" if bad else "")
                + f" | {slowest[0]}: {slowest[1] / 1000:.1f} ms |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
