"""How long one allreduce takes when the ranks did other work just before it.

    .venv/bin/torchrun --nproc-per-node 8 scripts/allreduce_after_work.py [--size 32M]
        [--backend shoal] [--trials 20] [--before none,refill,busy] [--barrier-after]

Each trial, on every rank: the work named by --before, then a barrier, then one timed in-place
all_reduce (SUM) of a float32 tensor; the figure is the largest over ranks of each rank's median.
The kinds of work before the barrier:

    none     nothing: the allreduce follows the previous trial's allreduce and barrier
    refill   copy fresh input into the tensor (what shoal.ray.profile does before each trial)
    busy     spin the CPU for --busy-ms in Python, touching no memory

--barrier-after adds an untimed barrier right after the timed allreduce, so that no rank starts
the next trial's work while another is still returning from the op.

Why it exists: with more ranks than cores, the slowest rank's time for an allreduce depends on
what the ranks that returned first do next: their work takes the cores from the ranks still
returning (BENCHMARKS.md, "Algorithm profile: 8 actors").
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="32M", help="bytes of the tensor (suffix K, M, G)")
    p.add_argument("--backend", default="shoal")
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--before", default="none,refill,busy")
    p.add_argument("--busy-ms", type=float, default=4.0)
    p.add_argument("--barrier-after", action="store_true", help="an untimed barrier after each timed op")
    a = p.parse_args()

    import torch
    import torch.distributed as dist

    import shoal  # noqa: F401  registers the backend
    from shoal.bench import parse_size

    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    n = parse_size(a.size) // 4
    src = torch.full((n,), float(rank + 1))
    buf = src.clone()
    expect = float(world * (world + 1) // 2)
    results = {}
    for kind in a.before.split(","):
        times = []
        for t in range(a.warmup + a.trials):
            if kind == "refill":
                buf.copy_(src)
            elif kind == "busy":
                end = time.perf_counter() + a.busy_ms / 1e3
                while time.perf_counter() < end:
                    pass
            elif kind != "none":
                raise SystemExit(f"unknown --before kind {kind!r}")
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            dt = time.perf_counter() - t0
            if a.barrier_after:
                dist.barrier()
            # Only refill checks the sum: the other kinds write nothing before the op (that is the
            # point), so they reduce sums of sums; timing does not depend on the values.
            if kind == "refill" and buf[0].item() != expect:
                raise AssertionError(f"rank {rank}: wrong sum {buf[0].item()} (expected {expect})")
            if t >= a.warmup:
                times.append(dt)
        results[kind] = statistics.median(times)
    everyone = [None] * world
    dist.all_gather_object(everyone, results)
    if rank == 0:
        print(f"# {a.backend} all_reduce of {a.size} float32, {world} ranks on {os.cpu_count()} cpus, "
              f"{a.trials} trials{', barrier after each op' if a.barrier_after else ''}; "
              "time = max over ranks of the median")
        for kind in results:
            label = f"busy {a.busy_ms:g} ms" if kind == "busy" else kind
            print(f"before: {label:<12} {1e3 * max(r[kind] for r in everyone):8.2f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
