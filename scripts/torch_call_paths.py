"""Times one all_reduce on a shoal group through four call paths, to tell torch's cost per call from
shoal's (BENCHMARKS.md, "Through torch: where a call's time goes"):

  dist.all_reduce          torch.distributed's Python, the ProcessGroup, the backend, a Work
  pg.allreduce.wait        the ProcessGroup's method and a Work, without torch.distributed's Python
  backend.allreduce.wait   shoal's backend and its Work, without the ProcessGroup
  inline                   shoal.torch.all_reduce_: a blocking call, no Work

Run under torchrun, e.g. `.venv/bin/torchrun --nproc-per-node 2 scripts/torch_call_paths.py 2M`.
Rank 0 prints µs per call for each path, one column per round (the paths take turns each round).
`--sched` then runs each path once more and prints what the scheduler gave each rank's calling
thread per call (from /proc/thread-self/schedstat: time on a CPU, time runnable but queued, times
scheduled in; with asyncOp False every path runs its op on that thread);
`--busy US` spins that long in Python before each call, as a program's own work between calls.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

import shoal.torch
from shoal.bench import parse_size, time_in_turns


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("size", type=parse_size, help="bytes of the float32 tensor (suffixes K, M, G)")
    p.add_argument("--calls", type=int, default=400, help="timed calls per path and round")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--sched", action="store_true", help="also print each rank's scheduling per call")
    p.add_argument("--busy", type=float, default=0.0, help="µs of Python work before each call")
    a = p.parse_args()
    dist.init_process_group("gloo")
    g = dist.new_group(backend="shoal")
    backend = g._get_backend(torch.device("cpu"))
    t = torch.zeros(max(1, a.size // 4))
    opts = dist.AllreduceOptions()
    opts.asyncOp = False  # as dist.all_reduce sets it for a call that waits (the default is True)
    paths = {
        "dist.all_reduce": lambda: dist.all_reduce(t, group=g),
        "pg.allreduce.wait": lambda: g.allreduce([t], opts).wait(),
        "backend.allreduce.wait": lambda: backend.allreduce([t], opts).wait(),
        "inline": lambda: shoal.torch.all_reduce_(t, group=g),
    }
    if a.busy > 0:
        paths = {name: with_work(f, a.busy * 1e-6) for name, f in paths.items()}
    time_in_turns(paths, a.calls, a.rounds, g)
    if a.sched:
        for name, f in paths.items():
            dist.barrier(group=g)
            before = schedstat()
            for _ in range(a.calls):
                f()
            after = schedstat()
            mine = [(y - x) / a.calls for x, y in zip(before, after)]
            every = [None] * dist.get_world_size()
            dist.all_gather_object(every, mine, group=g)
            if dist.get_rank() != 0:
                continue
            for r, (run, queued, slices) in enumerate(every):
                print(f"{name:24s} rank {r}: on a CPU {run / 1e3:6.1f} µs, queued {queued / 1e3:6.1f} µs, "
                      f"scheduled in {slices:4.2f} times per call")
    dist.destroy_process_group()


def with_work(call, seconds: float):
    def f():
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
        call()

    return f


def schedstat() -> tuple:
    """This thread's ns on a CPU, ns runnable but queued, and times scheduled in (Linux)."""
    with open("/proc/thread-self/schedstat") as fh:
        return tuple(int(x) for x in fh.read().split())


if __name__ == "__main__":
    main()
