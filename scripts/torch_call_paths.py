"""Times one all_reduce on a shoal group through four call paths, to tell torch's cost per call from
shoal's (BENCHMARKS.md, "Through torch: where a call's time goes"):

  dist.all_reduce          torch.distributed's Python, the ProcessGroup, the backend, a Work
  pg.allreduce.wait        the ProcessGroup's method and a Work, without torch.distributed's Python
  backend.allreduce.wait   shoal's backend and its Work, without the ProcessGroup
  inline                   shoal.torch.all_reduce_: a blocking call, no Work

Run under torchrun, e.g. `.venv/bin/torchrun --nproc-per-node 2 scripts/torch_call_paths.py 2M`.
Rank 0 prints µs per call for each path, one column per round (the paths take turns each round).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

import shoal.torch
from shoal.bench import parse_size, time_in_turns


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("size", type=parse_size, help="bytes of the float32 tensor (suffixes K, M, G)")
    p.add_argument("--calls", type=int, default=400, help="timed calls per path and round")
    p.add_argument("--rounds", type=int, default=4)
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
    time_in_turns(paths, a.calls, a.rounds, g)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
