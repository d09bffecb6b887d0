"""Times ray.util.collective's broadcast, barrier, allgather, reduce and allreduce on shoal inside W
Ray actors on this host: each op --iters times in a loop in every actor, --rounds rounds. Prints
µs per op, the largest over the actors, one line per round (BENCHMARKS.md, "Ray's collectives ran
as async ops").

    .venv/bin/python scripts/ray_collective_ops.py W BYTES     e.g. 2 4096
"""

from __future__ import annotations

import argparse
import time

import ray
import ray.util.collective as col

GROUP = "ray_collective_ops"


@ray.remote(num_cpus=0)
class Rank:
    def __init__(self):
        import shoal  # noqa: F401  (registers the backend in this worker)

    def init(self, world: int, rank: int) -> None:
        col.init_collective_group(world, rank, backend="shoal", group_name=GROUP)

    def run(self, world: int, nbytes: int, iters: int) -> dict:
        import torch

        t = torch.zeros(max(1, nbytes // 4))  # repeated sums stay exact
        out = [torch.zeros_like(t) for _ in range(world)]
        ops = {
            "broadcast": lambda: col.broadcast(t, 0, GROUP),
            "barrier": lambda: col.barrier(GROUP),
            "allgather": lambda: col.allgather(out, t, GROUP),
            "reduce": lambda: col.reduce(t, 0, GROUP),
            "allreduce": lambda: col.allreduce(t, GROUP),
        }
        us = {}
        for name, call in ops.items():
            for _ in range(50):
                call()
            col.barrier(GROUP)
            start = time.perf_counter()
            for _ in range(iters):
                call()
            us[name] = (time.perf_counter() - start) / iters * 1e6
        return us


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("world", type=int, help="actors")
    p.add_argument("nbytes", type=int, help="bytes of each rank's float32 tensor")
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    ray.init(include_dashboard=False, log_to_driver=False)
    try:
        ranks = [Rank.remote() for _ in range(a.world)]
        ray.get([r.init.remote(a.world, i) for i, r in enumerate(ranks)])
        for _ in range(a.rounds):
            per_rank = ray.get([r.run.remote(a.world, a.nbytes, a.iters) for r in ranks])
            print(" ".join(f"{op} {max(u[op] for u in per_rank):.1f}" for op in per_rank[0]), flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
