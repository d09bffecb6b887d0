"""Transfers per second of one torch tensor from one Ray actor to another, three ways, one run:

* ``shoal``   — Ray Direct Transport over shoal (``@ray.method(tensor_transport="shoal")``);
* ``objstore`` — Ray's object store (a plain ``@ray.method``);
* ``gloo``    — Ray's built-in GLOO direct transport (``tensor_transport="gloo"``);
* ``nodata``, ``nodata1`` — the floor (:mod:`shoal.ray.rdt_floor`): a two-sided and a one-sided
  transport that move no data (the bytes ride in the metadata), so their rate is the most that
  Ray's RDT machinery allows a transport of that kind; run only up to 64 KiB tensors.

One transfer is one ``ray.get(consumer.take.remote(producer.give.remote()))``: the producer
returns a tensor it allocated once (so that producing costs nothing), the consumer receives it and
returns its element count. Before timing, one transfer per transport and size is checked: the
consumer returns the tensor's sum, which must equal its element count. Transfers run one after
another, so a transfer's time includes Ray's task round trips (what a user sees), and
transfers/s is 1 / that time.

    python -m shoal.ray.rdt_bench                       # sizes 1, 1Mi, 100Mi float32 elements
    python -m shoal.ray.rdt_bench --sizes 1,64Ki --min-time 1 --json out.json

Two actors of one CPU each on a local Ray started here (``ray.init``); both groups (shoal and
gloo) hold the same two actors.

    python -m shoal.ray.rdt_bench --sizes 1 --transports shoal,objstore,nodata   # shoal against its floor
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Dict, List

TRANSPORTS = ["shoal", "objstore", "gloo"]
FLOORS = ["nodata", "nodata1"]  # see shoal.ray.rdt_floor
_SUFFIX = {"": 1, "k": 1000, "ki": 1 << 10, "m": 1000**2, "mi": 1 << 20, "g": 1000**3, "gi": 1 << 30}


def parse_count(s: str) -> int:
    s = s.strip()
    i = len(s)
    while i and not s[i - 1].isdigit():
        i -= 1
    num, suf = s[:i], s[i:].lower()
    if not num or suf not in _SUFFIX:
        raise argparse.ArgumentTypeError(f"not an element count: {s!r} (e.g. 1, 1024, 1Mi, 100Mi)")
    return int(num) * _SUFFIX[suf]


def fmt_count(n: int) -> str:
    for suf, k in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k}{suf}"
    return str(n)


def _actor_class():
    import ray
    import torch

    @ray.remote(num_cpus=1)
    class Peer:
        def __init__(self):
            import shoal  # noqa: F401  registers the "shoal" collective backend and transport

            self.t = None

        def alloc(self, n: int) -> int:
            self.t = None
            self.t = torch.ones(n, dtype=torch.float32)  # touched once, here
            return n

        @ray.method(tensor_transport="shoal")
        def give_shoal(self):
            return self.t

        @ray.method(tensor_transport="gloo")
        def give_gloo(self):
            return self.t

        def give_objstore(self):
            return self.t

        @ray.method(tensor_transport="nodata")
        def give_nodata(self):
            return self.t

        @ray.method(tensor_transport="nodata1")
        def give_nodata1(self):
            return self.t

        def take(self, t) -> int:
            return t.numel()

        def checksum(self, t) -> float:
            return float(t.sum(dtype=torch.float64))  # exact for any count of ones

    return Peer


def _time(fn, min_time: float, min_iters: int, max_iters: int) -> Dict[str, float]:
    fn()  # warm up: the first transfer of a size allocates and maps
    times: List[float] = []
    start = time.perf_counter()
    while len(times) < max_iters and (len(times) < min_iters or time.perf_counter() - start < min_time):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    return {"iters": len(times), "median_s": med, "mean_s": sum(times) / len(times), "min_s": times[0],
            "per_s": 1.0 / med}


def run(sizes: List[int], transports: List[str], min_time: float, min_iters: int, max_iters: int,
        log=print) -> List[dict]:
    import ray
    from ray.experimental.collective import create_collective_group, destroy_collective_group

    from shoal.ray import rdt_floor, register

    register()  # idempotent; needed before @ray.method(tensor_transport="shoal") is evaluated
    rdt_floor.register()
    Peer = _actor_class()
    src, dst = Peer.remote(), Peer.remote()
    groups = []
    try:
        if "shoal" in transports:
            groups.append(create_collective_group([src, dst], backend="shoal", name="rdt_bench_shoal"))
        if "gloo" in transports:
            groups.append(create_collective_group([src, dst], backend="gloo", name="rdt_bench_gloo"))
        rows = []
        for n in sizes:
            ray.get(src.alloc.remote(n))
            row = {"elements": n, "bytes": 4 * n, "dtype": "float32"}
            for tr in transports:
                if tr in FLOORS and 4 * n > rdt_floor.MAX_BYTES:
                    continue
                give = getattr(src, f"give_{tr}")
                got = ray.get(dst.checksum.remote(give.remote()))
                if got != n:
                    raise AssertionError(f"rdt_bench: {tr} delivered a wrong tensor of {n} elements: sum {got}")

                def once():
                    got = ray.get(dst.take.remote(give.remote()))
                    assert got == n, (got, n)

                r = _time(once, min_time, min_iters if n < (1 << 24) else max(1, min_iters // 2), max_iters)
                row[tr] = r
                log(f"# {fmt_count(n):>6} {tr:<8} {r['per_s']:10.1f} transfers/s  "
                    f"(median {r['median_s'] * 1e3:.2f} ms of {r['iters']})")
            for base in ("objstore", "gloo"):
                if "shoal" in row and base in row:
                    row[f"shoal/{base}"] = row["shoal"]["per_s"] / row[base]["per_s"]
            rows.append(row)
        ray.get(src.alloc.remote(0))
        return rows
    finally:
        for g in groups:
            try:
                destroy_collective_group(g)
            except Exception:  # noqa: BLE001
                pass
        for a in (src, dst):
            ray.kill(a)


def table(rows: List[dict], transports: List[str]) -> str:
    head = f"{'elements':>10} {'bytes':>12}" + "".join(f" {t + '/s':>12}" for t in transports)
    ratios = [b for b in ("objstore", "gloo") if "shoal" in transports and b in transports]
    head += "".join(f" {'shoal/' + b:>14}" for b in ratios)
    lines = [head]
    for r in rows:
        line = f"{fmt_count(r['elements']):>10} {r['bytes']:>12}"
        line += "".join(f" {r[t]['per_s']:>12.1f}" if t in r else f" {'-':>12}" for t in transports)
        line += "".join(f" {r['shoal/' + b]:>13.2f}x" for b in ratios)
        lines.append(line)
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m shoal.ray.rdt_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1,1Mi,100Mi",
                   help="float32 element counts, comma separated (suffixes Ki, Mi, Gi, k, M, G)")
    p.add_argument("--transports", default=",".join(TRANSPORTS + FLOORS),
                   help="subset of " + ",".join(TRANSPORTS + FLOORS))
    p.add_argument("--min-time", type=float, default=2.0, help="seconds per (size, transport), at least")
    p.add_argument("--min-iters", type=int, default=10, help="transfers per (size, transport), at least "
                   "(half of it from 16Mi elements up)")
    p.add_argument("--max-iters", type=int, default=2000)
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON ('-' for stdout)")
    p.add_argument("--object-store-memory", type=parse_count, default=None,
                   help="bytes for Ray's object store (default: Ray's)")
    a = p.parse_args(argv)
    sizes = [parse_count(s) for s in a.sizes.split(",") if s.strip()]
    transports = [t.strip() for t in a.transports.split(",") if t.strip()]
    bad = [t for t in transports if t not in TRANSPORTS + FLOORS]
    if bad:
        p.error(f"unknown transport(s) {bad}; choose from {TRANSPORTS + FLOORS}")

    import ray

    own = not ray.is_initialized()
    if own:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="warning",
                 object_store_memory=a.object_store_memory)
    try:
        import torch

        print(f"# shoal Ray Direct Transport benchmark: 2 actors, 1 transfer in flight, float32")
        print(f"# ray {ray.__version__}, torch {torch.__version__}, python {platform.python_version()}, "
              f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}")
        rows = run(sizes, transports, a.min_time, a.min_iters, a.max_iters,
                   log=lambda s: print(s, file=sys.stderr, flush=True))
    finally:
        if own:
            ray.shutdown()
    print(table(rows, transports))
    if a.json:
        doc = {"benchmark": "shoal.ray.rdt_bench", "ray": ray.__version__, "cpus": os.cpu_count(),
               "load": os.getloadavg()[0], "rows": rows}
        s = json.dumps(doc, indent=2)
        if a.json == "-":
            print(s)
        else:
            with open(a.json, "w") as f:
                f.write(s + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
