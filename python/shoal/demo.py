"""Data-parallel training over torch.distributed, on shoal and then on gloo, from the same seed.

    python -m shoal.demo -n 4 --backends shoal,gloo --epochs 20

A small MLP learns scikit-learn's digits (8x8 images of the digits 0-9; 1437 training images,
360 held out). Each backend gets n fresh ranks (``init_process_group(backend)``, env://), and
trains with DistributedDataParallel: every step, each rank takes its share of one global batch,
so every backend computes the same thing and the per-epoch losses agree to floating-point
tolerance (only the order of the gradient sums differs). Rank 0 prints each epoch's loss (mean
over all ranks) and the time; at the end, the held-out accuracy and a comparison of the backends.

``train()`` and ``make_model()`` are also what tests/python/test_ddp_fsdp.py and
``python -m shoal.bench --ddp`` use.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

if TYPE_CHECKING:
    import torch

SEED = 0
BATCH = 64  # global batch; each rank takes BATCH // world_size samples of it
LR = 0.05


def load_digits_split() -> "tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]":
    """(x_train, y_train, x_test, y_test) as float32/int64 tensors, a fixed 80/20 split."""
    import torch
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(1234))
    x, y = x[perm], y[perm]
    n_train = int(0.8 * len(x))
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def make_model(seed: int = SEED, hidden: int = 128) -> "torch.nn.Module":
    import torch
    import torch.nn as nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def train(rank: int, world_size: int, group: Optional["torch.distributed.ProcessGroup"] = None, epochs: int = 8,
          mode: str = "ddp", verbose: bool = False, label: str = "",
          comm_hook: Optional[Callable[..., Any]] = None) -> Dict[str, Any]:
    """Trains make_model() on the digits with `mode` "ddp" (DistributedDataParallel over `group`,
    with `comm_hook` registered if given) or "fsdp" (FSDP2 fully_shard over a device mesh of
    `group`). Returns {"losses": per-epoch loss averaged over all steps and ranks, "accuracy": on
    the held-out images, "params": the trained parameters, whole and flattened into one tensor,
    "seconds": training time, "epoch_seconds": per epoch}. Every rank must call it."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    if group is None:
        group = dist.group.WORLD
    x_train, y_train, x_test, y_test = load_digits_split()
    model = make_model()
    if mode == "ddp":
        net = nn.parallel.DistributedDataParallel(model, process_group=group)
        if comm_hook is not None:
            net.register_comm_hook(None, comm_hook)
    elif mode == "fsdp":
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        net = fully_shard(model, mesh=mesh)
    else:
        raise ValueError(f"mode {mode!r}")
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    per_rank = BATCH // world_size
    steps = len(x_train) // (per_rank * world_size)
    losses, epoch_seconds = [], []
    dist.barrier(group=group)
    start = time.perf_counter()
    for epoch in range(epochs):
        t0 = time.perf_counter()
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        total = torch.zeros(1, dtype=torch.float64)
        for step in range(steps):
            idx = order[step * BATCH : (step + 1) * BATCH][rank * per_rank : (rank + 1) * per_rank]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(x_train[idx]), y_train[idx])
            loss.backward()
            opt.step()
            total += loss.detach().double()
        dist.all_reduce(total, group=group)
        losses.append(total.item() / (steps * world_size))
        epoch_seconds.append(time.perf_counter() - t0)
        if verbose and rank == 0:
            print(f"  {label}epoch {epoch + 1:>2}  loss {losses[-1]:.6f}  {epoch_seconds[-1]:6.2f} s", flush=True)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        accuracy = (net(x_test).argmax(1) == y_test).double().mean().item()
        params = torch.cat([(p.full_tensor() if mode == "fsdp" else p).detach().flatten() for p in net.parameters()])
    return {"losses": losses, "accuracy": accuracy, "params": params, "seconds": seconds, "epoch_seconds": epoch_seconds}


def _rank(rank, world_size, backend, epochs):
    import torch
    import torch.distributed as dist

    import shoal  # noqa: F401  (registers the backend)

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        return train(rank, world_size, epochs=epochs, verbose=True, label=f"{backend:>6} ")
    finally:
        dist.destroy_process_group()


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=4, help="ranks (local processes)")
    p.add_argument("--backends", default="shoal,gloo")
    p.add_argument("--epochs", type=int, default=20)
    a = p.parse_args(argv)
    from ._launch import launch

    backends = a.backends.split(",")
    res = {}
    for b in backends:
        print(f"DDP on {b}, {a.n} ranks: MLP 64-128-128-10 on scikit-learn digits, global batch {BATCH}, SGD", flush=True)
        res[b] = launch(_rank, a.n, b, a.epochs)[0]
        r = res[b]
        print(f"  {b:>6} accuracy {100 * r['accuracy']:.2f}% on {360} held-out images, {r['seconds']:.2f} s training\n", flush=True)
    print(f"per-epoch loss ({a.n} ranks, same seed)")
    print(f"{'epoch':>5} " + " ".join(f"{b:>12}" for b in backends) + ("   |difference|" if len(backends) == 2 else ""))
    for e in range(a.epochs):
        row = f"{e + 1:>5} " + " ".join(f"{res[b]['losses'][e]:>12.6f}" for b in backends)
        if len(backends) == 2:
            row += f"   {abs(res[backends[0]]['losses'][e] - res[backends[1]]['losses'][e]):.1e}"
        print(row)
    print(f"{'acc':>5} " + " ".join(f"{100 * res[b]['accuracy']:>11.2f}%" for b in backends))
    print(f"{'time':>5} " + " ".join(f"{res[b]['seconds']:>11.2f}s" for b in backends))
    if "shoal" in res and "gloo" in res:
        print(f"training time gloo/shoal: {res['gloo']['seconds'] / res['shoal']['seconds']:.2f}x")
    ok = all(r["accuracy"] > 0.9 for r in res.values())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
