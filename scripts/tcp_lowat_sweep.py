#!/usr/bin/env python3
"""TCP point to point across two fake hosts for several SHOAL_TCP_NOTSENT_LOWAT values (needs root).

    sudo scripts/tcp_lowat_sweep.py [--size 64M] [--runs 7] [--values 0,16384,32768,131072] [--streams 1,4]

`build/shoal-bench sendrecv -n 2 -b SIZE -e SIZE`, rank 0 on fake host 0 and rank 1 on fake host 1
(scripts/netns_hosts.py), once per value and stream count per run, in the same order every run;
prints the median GB/s over the runs of each setting (and every run's figure) as markdown.
0 is the kernel's default (no limit). The numbers in docs/multihost.md come from this script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import netns_hosts as nh  # noqa: E402

BUILD = os.environ.get("SHOAL_BUILD_DIR", os.path.join(os.path.dirname(HERE), "build"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="64M")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--values", default="0,16384,32768,131072")
    ap.add_argument("--streams", default="1,4")
    a = ap.parse_args()
    ok, why = nh.available()
    if not ok:
        print(f"tcp_lowat_sweep: skipped: {why}", file=sys.stderr)
        return nh.SKIP
    values = [int(v) for v in a.values.split(",")]
    streams = [int(s) for s in a.streams.split(",")]
    got: dict = {(s, v): [] for s in streams for v in values}
    with nh.FakeHosts(2) as hosts, tempfile.TemporaryDirectory(prefix="shoal-lowat-") as tmp:
        for run in range(a.runs):
            for s in streams:
                for v in values:
                    out = os.path.join(tmp, f"{run}-{s}-{v}.json")
                    env = dict(os.environ, SHOAL_TCP_STREAMS=str(s), SHOAL_TCP_NOTSENT_LOWAT=str(v))
                    argv = [os.path.join(BUILD, "shoal-bench"), "sendrecv", "-n", "2", "-b", a.size, "-e", a.size,
                            "--json", out]
                    res = nh.run_job(hosts, [0, 1], argv, env=env, store_bin=os.path.join(BUILD, "shoal-store"))
                    if not res.ok:
                        raise RuntimeError(res.describe())
                    with open(out) as fh:
                        got[(s, v)].append(json.load(fh)["rows"][0]["shoal_algbw"])
            print(f"run {run + 1}/{a.runs} done", file=sys.stderr)
    print(f"sendrecv {a.size} across 2 fake hosts, median of {a.runs} runs (GB/s = 1e9 B/s)\n")
    print("| streams | SHOAL_TCP_NOTSENT_LOWAT | median GB/s | runs |")
    print("|---|---|---|---|")
    for (s, v), xs in got.items():
        print(f"| {s} | {v or '0 (kernel default)'} | {statistics.median(xs):.2f} | "
              f"{' '.join(f'{x:.2f}' for x in xs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
