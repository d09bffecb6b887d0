"""Times torch.distributed's list collectives against their one-tensor forms on a shoal group: the
cost of taking one tensor per rank (BENCHMARKS.md, "A list op's copies").

  all_gather               a list of p output tensors
  all_gather(chunks)       the list: the chunks of one buffer (`list(flat.chunk(p))`)
  all_gather_into_tensor   one output tensor
  all_to_all               lists of p input and p output tensors
  all_to_all(chunks)       the lists: the chunks of one buffer each
  all_to_all_single        one input and one output tensor

SIZE is the bytes of one rank's block (float32). Run under torchrun, e.g.
`.venv/bin/torchrun --nproc-per-node 2 scripts/torch_list_ops.py 4K`. Rank 0 prints µs per call
for each op, one column per round (the ops take turns each round).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from shoal.bench import parse_size, time_in_turns


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("size", type=parse_size, help="bytes of one rank's float32 block (suffixes K, M, G)")
    p.add_argument("--calls", type=int, default=400, help="timed calls per op and round")
    p.add_argument("--rounds", type=int, default=4)
    a = p.parse_args()
    dist.init_process_group("gloo")
    g = dist.new_group(backend="shoal")
    n = dist.get_world_size()
    k = max(1, a.size // 4)
    block = torch.ones(k)
    blocks = [torch.ones(k) for _ in range(n)]
    outs = [torch.empty(k) for _ in range(n)]
    flat_in, flat_out = torch.ones(n * k), torch.empty(n * k)
    in_chunks, out_chunks = list(flat_in.chunk(n)), list(flat_out.chunk(n))
    ops = {
        "all_gather": lambda: dist.all_gather(outs, block, group=g),
        "all_gather(chunks)": lambda: dist.all_gather(out_chunks, block, group=g),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(flat_out, block, group=g),
        "all_to_all": lambda: dist.all_to_all(outs, blocks, group=g),
        "all_to_all(chunks)": lambda: dist.all_to_all(out_chunks, in_chunks, group=g),
        "all_to_all_single": lambda: dist.all_to_all_single(flat_out, flat_in, group=g),
    }
    time_in_turns(ops, a.calls, a.rounds, g)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
