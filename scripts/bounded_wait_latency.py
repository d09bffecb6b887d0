"""How long a 4 KiB all_reduce on a shoal group takes when its Work is waited for with a timeout
right after a run of ops waited for at once (BENCHMARKS.md, "The progress thread's ticks"). A
bounded wait cannot run the op on the waiting thread; the group's progress thread must start it.
Prints the median and the largest over the tries, on rank 0.

    .venv/bin/torchrun --nproc-per-node 2 scripts/bounded_wait_latency.py
"""

from __future__ import annotations

import argparse
import datetime
import time

import torch
import torch.distributed as dist

import shoal  # noqa: F401  (registers the backend)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tries", type=int, default=60)
    p.add_argument("--before", type=int, default=300, help="ops waited for at once before each try")
    a = p.parse_args()
    dist.init_process_group("gloo")
    g = dist.new_group(backend="shoal")
    backend = g._get_backend(torch.device("cpu"))
    t = torch.zeros(1024)
    opts = dist.AllreduceOptions()
    opts.asyncOp = False  # as dist.all_reduce sets it for a call that waits
    timeout = datetime.timedelta(seconds=30)
    us = []
    for _ in range(a.tries):
        for _ in range(a.before):
            backend.allreduce([t], opts).wait()
        dist.barrier(group=g)
        start = time.perf_counter()
        backend.allreduce([t], opts).wait(timeout)
        us.append((time.perf_counter() - start) * 1e6)
    us.sort()
    if dist.get_rank() == 0:
        print(f"a bounded wait after {a.before} ops waited for at once: median {us[len(us) // 2]:.0f} us, "
              f"largest {us[-1]:.0f} us ({a.tries} tries)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
