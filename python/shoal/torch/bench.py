"""torch.distributed collectives timed on several backends, same ranks, same tensors.

    python -m shoal.torch.bench -n 2 --op all_reduce --sizes 4K,1M,16M --backends gloo,shoal

Starts n local ranks per backend (env:// rendezvous), runs the op `--warmup` times, then times
`--iters` synchronous calls (dist.<op>(...) as user code calls it, wait included) and prints the
mean time per call on rank 0, in microseconds.
"""

from __future__ import annotations

import argparse
import os
import socket
import time

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(s: str) -> int:
    s = s.strip().upper().rstrip("B")
    unit = s[-1] if s and s[-1] in UNITS else ""
    return int(float(s[: len(s) - len(unit)]) * UNITS[unit])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank, n, port, backend, op, sizes, warmup, iters, queue):
    import torch
    import torch.distributed as dist

    import shoal  # noqa: F401

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=n)
    out = {}
    for nbytes in sizes:
        count = max(1, nbytes // 4)
        t = torch.ones(count)
        if op == "all_reduce":
            call = lambda: dist.all_reduce(t)  # noqa: E731
        elif op == "broadcast":
            call = lambda: dist.broadcast(t, 0)  # noqa: E731
        elif op == "all_gather":
            o = torch.empty(count * n)
            call = lambda: dist.all_gather_into_tensor(o, t)  # noqa: E731
        elif op == "reduce_scatter":
            big = torch.ones(count * n)
            call = lambda: dist.reduce_scatter_tensor(t, big)  # noqa: E731
        else:
            raise SystemExit(f"unknown op {op}")
        k = iters if nbytes < (1 << 20) else max(5, iters // 10)
        for _ in range(warmup):
            call()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(k):
            call()
        out[nbytes] = (time.perf_counter() - start) / k * 1e6
    if rank == 0:
        queue.put(out)
    dist.destroy_process_group()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=2, help="ranks (local processes)")
    p.add_argument("--op", default="all_reduce", choices=["all_reduce", "broadcast", "all_gather", "reduce_scatter"])
    p.add_argument("--sizes", default="4K,1M,16M", help="bytes per rank, comma separated (K, M, G)")
    p.add_argument("--backends", default="gloo,shoal")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=200, help="timed calls below 1 MiB (a tenth above)")
    a = p.parse_args(argv)
    import multiprocessing as mp

    sizes = [parse_size(s) for s in a.sizes.split(",")]
    ctx = mp.get_context("spawn")
    results = {}
    for backend in a.backends.split(","):
        q = ctx.Queue()
        port = _free_port()
        procs = [
            ctx.Process(target=_rank, args=(r, a.n, port, backend, a.op, sizes, a.warmup, a.iters, q))
            for r in range(a.n)
        ]
        for pr in procs:
            pr.start()
        results[backend] = q.get()
        for pr in procs:
            pr.join()
    names = list(results)
    print(f"{a.op}, {a.n} ranks, mean time per call (us)")
    print(f"{'bytes':>12} " + " ".join(f"{b:>10}" for b in names) + ("   speedup" if len(names) == 2 else ""))
    for s in sizes:
        row = f"{s:>12} " + " ".join(f"{results[b][s]:>10.1f}" for b in names)
        if len(names) == 2:
            row += f"   {results[names[0]][s] / results[names[1]][s]:>6.1f}x"
        print(row)


if __name__ == "__main__":
    main()
