#!/usr/bin/env python3
"""shoal across two fake hosts (scripts/netns_hosts.py): the link's capacity, TCP point-to-point,
and shoal vs Gloo collectives, in one run; prints markdown. Needs root (exit 77 otherwise).

    sudo scripts/multihost_bench.py [--rounds 3] [--p2p-rounds 7] [--json FILE] [--quick]

1. ceiling: iperf3 from fake host 0 to fake host 1 (the direction of shoal's sendrecv), one TCP
   stream (-P 1) and as many as shoal uses per peer (-P SHOAL_TCP_STREAMS, default 4); the
   ceiling is the better of the two.
2. p2p: `shoal-bench sendrecv --vs gloo`, rank 0 on host 0, rank 1 on host 1, 16..256 MiB, with
   shoal's default streams per peer, with SHOAL_TCP_STREAMS=1, and with SHOAL_TCP_NOTSENT_LOWAT=0.
   Steps 1 and 2 are repeated `--p2p-rounds` times, interleaved (the machine may be shared: the
   ratio shoal / iperf3 is taken per round, then the median over rounds); step 3 `--rounds` times.
3. collectives: allreduce, allgather, broadcast, reduce on 2 hosts x 2 ranks (ranks 0,1 on host 0,
   2,3 on host 1), 2 hosts x 3 ranks, and 2 x 2 interleaved (ranks 0,2 on host 0), 64 KiB..64 MiB: shoal's automatic choice (the
   hierarchical algorithms here) with `--vs gloo`, and shoal's flat algorithms (`--algo ring`:
   the ring allreduce/allgather and the pipelined chain broadcast; `--algo mst` for reduce, the
   binomial tree, which has no ring) in the same run, each with `--vs gloo` so that both run under
   the same conditions (Gloo's column is from the first). busbw is also given as a share of the
   link's ceiling (step 1).

The fake hosts are removed at the end (also after an error or Ctrl-C).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import netns_hosts as nh  # noqa: E402

BUILD = os.environ.get("SHOAL_BUILD_DIR", os.path.join(ROOT, "build"))
BENCH = os.path.join(BUILD, "shoal-bench")
STORE = os.path.join(BUILD, "shoal-store")
MiB = 1 << 20


def iperf3(hosts: nh.FakeHosts, streams: int, seconds: int) -> float:
    """GB/s (1e9 bytes/s) received by host 1 from host 0."""
    port = "5201"
    srv = hosts.run(1, ["iperf3", "-s", "-1", "-B", hosts.addr(1), "-p", port],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):  # wait until the server listens
            r = subprocess.run(hosts.argv(1, ["sh", "-c", f"ss -ltn | grep -q ':{port} '"]))
            if r.returncode == 0:
                break
            time.sleep(0.1)
        r = subprocess.run(hosts.argv(0, ["iperf3", "-c", hosts.addr(1), "-p", port, "-t", str(seconds),
                                          "-P", str(streams), "-J"]),
                           capture_output=True, text=True, timeout=seconds + 30)
        if r.returncode != 0:
            raise RuntimeError(f"iperf3 client: {r.stdout[-500:]} {r.stderr[-500:]}")
        return json.loads(r.stdout)["end"]["sum_received"]["bits_per_second"] / 8e9
    finally:
        srv.wait(timeout=10) if srv.poll() is None else None


# The flat algorithm each collective is compared with (the hierarchical one runs automatically).
FLAT = {"allreduce": "ring", "allgather": "ring", "broadcast": "ring", "reduce": "mst"}
LAYOUTS = {"2x2": [0, 0, 1, 1], "2x3": [0, 0, 0, 1, 1, 1], "2x2 interleaved": [0, 1, 0, 1]}


def bench(hosts: nh.FakeHosts, layout: list[int], op: str, lo: str, hi: str, f: str, env_extra: dict,
          tmp: str, algo: str | None = None) -> dict:
    out = os.path.join(tmp, f"{op}-{len(layout)}-{time.monotonic_ns()}.json")
    env = dict(os.environ, **env_extra)
    argv = [BENCH, op, "-n", str(len(layout)), "-b", lo, "-e", hi, "-f", f, "--json", out]
    # Gloo runs beside shoal in every collective run, flat ones too, so that both shoal columns are
    # taken under the same conditions (Gloo's threads and buffers live in the same processes).
    argv += ["--vs", "gloo"] + (["--algo", algo] if algo else [])
    res = nh.run_job(hosts, layout, argv, env=env, store_bin=STORE, timeout=600)
    if not res.ok:
        raise RuntimeError(f"{' '.join(argv)} failed\n{res.describe()}")
    with open(out) as fh:
        return json.load(fh)


def fmt_bytes(b: int) -> str:
    return f"{b // MiB} MiB" if b >= MiB else f"{b // 1024} KiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the collectives (step 3)")
    ap.add_argument("--p2p-rounds", type=int, default=7,
                    help="rounds of steps 1 and 2 (cheap, and the veth link's speed varies from run to run)")
    ap.add_argument("--iperf-time", type=int, default=5, help="seconds per iperf3 run")
    ap.add_argument("--json", help="write every measurement to this file")
    ap.add_argument("--quick", action="store_true", help="1 round, smaller sweeps (smoke run)")
    a = ap.parse_args()
    ok, why = nh.available()
    if not ok:
        print(f"multihost_bench: skipped: {why}", file=sys.stderr)
        return nh.SKIP
    for b in (BENCH, STORE):
        if not os.access(b, os.X_OK):
            print(f"multihost_bench: {b} not built (cmake --build build)", file=sys.stderr)
            return 2
    rounds = 1 if a.quick else a.rounds
    p2p_rounds = 1 if a.quick else a.p2p_rounds
    streams = int(os.environ.get("SHOAL_TCP_STREAMS", "4") or 4)
    p2p_hi = "64M" if a.quick else "256M"
    coll_hi = "4M" if a.quick else "64M"
    # name -> (column label, environment): the default, one stream, and no TCP_NOTSENT_LOWAT (the
    # kernel's default, to show what that setting does; src/transport/tcp_link.h)
    stream_cfgs = [("default", (f"shoal ({streams} streams)", {}))]
    if streams != 1:
        stream_cfgs.append(("1", ("shoal (1 stream)", {"SHOAL_TCP_STREAMS": "1"})))
    stream_cfgs.append(("nolowat", (f"shoal ({streams} streams, SHOAL_TCP_NOTSENT_LOWAT=0)",
                                    {"SHOAL_TCP_NOTSENT_LOWAT": "0"})))
    results: dict = {"rounds": [], "collectives": {}}

    with nh.FakeHosts(2) as hosts, tempfile.TemporaryDirectory(prefix="shoal-mh-") as tmp:
        for rnd in range(p2p_rounds):
            r: dict = {"iperf3": {}, "sendrecv": {}}
            r["iperf3"]["P1"] = iperf3(hosts, 1, a.iperf_time)
            if streams != 1:
                r["iperf3"][f"P{streams}"] = iperf3(hosts, streams, a.iperf_time)
            for name, (_, extra) in stream_cfgs:
                r["sendrecv"][name] = bench(hosts, [0, 1], "sendrecv", "16M", p2p_hi, "2", extra, tmp)
            results["rounds"].append(r)
            print(f"p2p round {rnd + 1}/{p2p_rounds} done", file=sys.stderr)
        for rnd in range(rounds):
            for lname, layout in LAYOUTS.items():
                for op, flat in FLAT.items():
                    results["collectives"].setdefault(f"{op} {lname}", {"flat_algo": flat, "rounds": []})
                    results["collectives"][f"{op} {lname}"]["rounds"].append({
                        "auto": bench(hosts, layout, op, "64K", coll_hi, "4", {}, tmp),
                        "flat": bench(hosts, layout, op, "64K", coll_hi, "4", {}, tmp, algo=flat)})
            print(f"collectives round {rnd + 1}/{rounds} done", file=sys.stderr)
    if nh.existing_hosts():
        print("multihost_bench: fake hosts left behind!", file=sys.stderr)
        return 1

    # ---- report --------------------------------------------------------------------------
    R = results["rounds"]
    ceil = [max(x["iperf3"].values()) for x in R]
    sr0 = R[0]["sendrecv"]["default"]
    print(f"# shoal across 2 fake hosts (netns + UTS + private /dev/shm, veth + bridge, MTU 1500)\n")
    print(f"machine: {sr0['machine']['nproc']} x {sr0['machine']['model']}; {p2p_rounds} round(s) of p2p, "
          f"{rounds} of collectives; "
          f"shoal TCP streams per peer: {streams} (default) unless said; GB/s = 1e9 B/s\n")
    print("## Link capacity: iperf3 host 0 -> host 1\n")
    keys = list(R[0]["iperf3"])
    print("| round | " + " | ".join(f"iperf3 -P {k[1:]} (GB/s)" for k in keys) + " | ceiling (GB/s) |")
    print("|---|" + "---|" * len(keys) + "---|")
    for i, x in enumerate(R):
        print(f"| {i + 1} | " + " | ".join(f"{x['iperf3'][k]:.2f}" for k in keys) + f" | {ceil[i]:.2f} |")
    print()
    print("## TCP point-to-point: shoal-bench sendrecv, rank 0 (host 0) -> rank 1 (host 1)\n")
    print("Median over rounds; `% ceiling` is the median of the per-round ratio to that round's ceiling.\n")
    hdr = "| size |"
    for _, (lab, _) in stream_cfgs:
        hdr += f" {lab} GB/s | % ceiling |"
    hdr += " gloo GB/s | % ceiling |"
    print(hdr)
    print("|---|" + "---|---|" * (len(stream_cfgs) + 1))
    sizes = [row["bytes"] for row in sr0["rows"]]
    for si, size in enumerate(sizes):
        line = f"| {fmt_bytes(size)} |"
        cols = [(name, "shoal") for name, _ in stream_cfgs] + [("default", "gloo")]
        for name, backend in cols:
            bw = [x["sendrecv"][name]["rows"][si].get(f"{backend}_algbw") or
                  (size / x["sendrecv"][name]["rows"][si][f"{backend}_us"] / 1e3
                   if x["sendrecv"][name]["rows"][si].get(f"{backend}_us") else 0.0) for x in R]
            pct = [100 * b / c for b, c in zip(bw, ceil)]
            line += f" {statistics.median(bw):.2f} | {statistics.median(pct):.0f}% |"
        print(line)
    print()
    print("## Collectives across 2 hosts: hierarchical (shoal's automatic choice) vs flat vs Gloo\n")
    print("2x2: ranks 0,1 on host 0 and 2,3 on host 1; 2x3: ranks 0-2 on host 0 and 3-5 on host 1; 2x2 "
          "interleaved: ranks 0,2 on host 0 and 1,3 on host 1 (a flat ring crosses hosts at every step). Times are "
          "medians over rounds; `gloo/hier` and `flat/hier` are time ratios taken per round (above 1: the "
          "hierarchical algorithm is faster), then the median; `% ceiling` is hier's median busbw over the "
          "median iperf3 ceiling.\n")
    ceiling = statistics.median(ceil)
    med = statistics.median
    for name, res in results["collectives"].items():
        flat = res["flat_algo"]
        runs = res["rounds"]
        print(f"### {name}\n")
        print(f"| size | hier (us) | hier busbw (GB/s) | % ceiling | flat {flat} (us) | gloo (us) | gloo/hier | "
              f"flat/hier |")
        print("|---|---|---|---|---|---|---|---|")
        for i, row in enumerate(runs[0]["auto"]["rows"]):
            hs = [x["auto"]["rows"][i] for x in runs]
            fs = [x["flat"]["rows"][i] for x in runs]
            algos = {r.get("shoal_algo") for r in hs}
            assert algos == {"hier"}, f"{name}: the automatic choice was {algos}, not hier"
            print(f"| {fmt_bytes(row['bytes'])} | {med(r['shoal_us'] for r in hs):.0f} | "
                  f"{med(r['shoal_busbw'] for r in hs):.3f} | {100 * med(r['shoal_busbw'] for r in hs) / ceiling:.0f}% | "
                  f"{med(r['shoal_us'] for r in fs):.0f} | {med(r['gloo_us'] for r in hs):.0f} | "
                  f"{med(r['ratio'] for r in hs):.2f} | "
                  f"{med(y['shoal_us'] / x['shoal_us'] for x, y in zip(hs, fs)):.2f} |")
        print()
    print("Commands: `iperf3 -s -1 -B 10.77.0.2` on host 1, `iperf3 -c 10.77.0.2 -t T -P 1|N -J` on host 0; "
          "`build/shoal-bench sendrecv -n 2 -b 16M -e 256M -f 2 --vs gloo` (ranks on hosts 0, 1); "
          "`build/shoal-bench OP -n N -b 64K -e 64M -f 4 --vs gloo` and the same with `--algo ring|mst` "
          "(ranks on hosts 0, 0, 1, 1 or 0, 0, 0, 1, 1, 1 or 0, 1, 0, 1); "
          "store: `build/shoal-store --port 0 --host 10.77.0.1` on host 0.")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
