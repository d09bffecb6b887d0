"""Time torch.distributed.all_reduce on the shoal backend per call, with its CPU time and context
switches per call on every rank: where the CPU of a small op through torch goes.

    .venv/bin/python scripts/torch_op_cpu.py -n 2 --numel 1024 [--iters 3000] [--gc freeze|off] [--inline]
    # profile only the loop (its start takes ~8 s here):
    perf record -g --delay=9000 -- .venv/bin/python scripts/torch_op_cpu.py -n 2 --iters 600000
    perf report --no-children --sort dso
"""

from __future__ import annotations

import argparse
import resource
import time

from shoal._launch import launch


def _rank(rank, world_size, iters, numel, gc_mode, inline):
    import gc

    import torch
    import torch.distributed as dist

    import shoal.torch

    dist.init_process_group("shoal")
    all_reduce = shoal.torch.all_reduce_ if inline else dist.all_reduce
    t = torch.ones(numel)
    for _ in range(200):
        all_reduce(t)
    dist.barrier()
    if gc_mode == "freeze":
        gc.freeze()
    elif gc_mode == "off":
        gc.disable()
    r0, c0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), time.perf_counter()
    for _ in range(iters):
        all_reduce(t)
    w1, c1, r1 = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
    dist.barrier()
    dist.destroy_process_group()
    return ((w1 - w0) / iters * 1e6, (c1 - c0) / iters * 1e6, (r1.ru_nvcsw - r0.ru_nvcsw) / iters,
            (r1.ru_nivcsw - r0.ru_nivcsw) / iters)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=2, help="ranks")
    ap.add_argument("--numel", type=int, default=1024, help="float32 elements (1024: 4 KiB)")
    ap.add_argument("--iters", type=int, default=3000)
    ap.add_argument("--gc", choices=["on", "freeze", "off"], default="on", help="Python's GC during the loop")
    ap.add_argument("--inline", action="store_true", help="shoal.torch.all_reduce_ instead of dist.all_reduce")
    a = ap.parse_args()
    for r, (wall, cpu, vol, invol) in enumerate(launch(_rank, a.n, a.iters, a.numel, a.gc, a.inline)):
        print(f"rank {r}: {wall:.1f} us/op wall, {cpu:.1f} us/op CPU, {vol:.2f} voluntary and "
              f"{invol:.2f} involuntary context switches/op")


if __name__ == "__main__":
    main()
