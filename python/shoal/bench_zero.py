"""ZeRO's parameter sync, timed on each backend by ``python -m shoal.bench --zero``.

torch's ``ZeroRedundancyOptimizer`` (ZeRO stage 1) gives each rank the optimizer state of a shard
of the parameters; its ``step()`` updates that shard and then broadcasts every parameter from the
rank that owns it: one ``dist.broadcast(param, src=owner, async_op=True)`` per parameter, from
every rank in turn, and a wait on all of them. Many small async broadcasts from changing roots:
the pattern this measures, as the optimizer runs it, on three models (a few large tensors, a
small MLP, and 400 small tensors as in a deep network's layers).

Per model and backend: the mean time of ``step()`` (gradients set once, the same on every rank,
so the work per step is fixed), the largest over ranks; ``compute`` is the local optimizer's
step over the shard alone (no communication). Check: after the timed steps every rank's
parameters equal, bit for bit, those of a plain SGD run on one process with the same gradients.
"""

from __future__ import annotations

import time


def _models():
    import torch.nn as nn

    from .bench import _wide_mlp
    from .demo import make_model

    def many_small():
        import torch

        torch.manual_seed(0)
        return nn.Sequential(*[nn.Linear(64, 64) for _ in range(200)])  # 400 tensors, 16 KiB and 256 B

    return [("digits MLP", make_model, 40), ("wide MLP", _wide_mlp, 10), ("400 small", many_small, 20)]


def _fill_grads(model) -> None:
    import torch

    gen = torch.Generator().manual_seed(7)
    for q in model.parameters():
        q.grad = torch.randn(q.shape, generator=gen) * 1e-3


def bench_zero(rank, p, groups, ctl, cfg):
    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from .bench import _agree

    MAX, MIN = dist.ReduceOp.MAX, dist.ReduceOp.MIN
    rows = []
    for name, build, steps in _models():
        steps = max(2, steps * cfg["zero_steps"] // 40)
        ref = build()
        row = {"model": name, "params": sum(q.numel() for q in ref.parameters()),
               "tensors": len(list(ref.parameters())), "steps": steps}
        _fill_grads(ref)
        sgd = torch.optim.SGD(ref.parameters(), lr=0.01)
        with torch.no_grad():
            for _ in range(steps + 1):  # one untimed step, then the timed ones
                sgd.step()
        bad = []
        for b, g in groups.items():
            model = build()
            _fill_grads(model)
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.01,
                                          process_group=g)
            opt.step()
            dist.barrier(group=g)
            start = time.perf_counter()
            for _ in range(steps):
                opt.step()
            row[f"{b}_ms"] = _agree(ctl, (time.perf_counter() - start) / steps * 1e3, MAX)
            same = all(torch.equal(q, r) for q, r in zip(model.parameters(), ref.parameters()))
            if _agree(ctl, float(same), MIN) < 1:
                bad.append(b)
            if "compute_ms" not in row:  # this rank's shard updated by the local optimizer alone
                local = opt.optim
                start = time.perf_counter()
                for _ in range(steps):
                    local.step()
                row["compute_ms"] = _agree(ctl, (time.perf_counter() - start) / steps * 1e3, MAX)
            del opt, model
        row["ratio"] = row["gloo_ms"] / row["shoal_ms"] if "gloo" in groups and "shoal" in groups else None
        row["check"] = "ok" if not bad else "FAIL " + ",".join(bad)
        rows.append(row)
    return rows


def print_zero(rows, backends, p) -> None:
    print(f"# ZeRO step (ZeroRedundancyOptimizer, SGD), {p} ranks: mean step time in ms (max over ranks); "
          "compute = the local optimizer over this rank's shard, no communication")
    cols = "".join(f" {b + ' ms':>10}" for b in backends)
    ratio = f" {'gloo/shoal':>10}" if "gloo" in backends and "shoal" in backends else ""
    print(f"{'model':>12} {'params':>9} {'tensors':>7} {'steps':>5} {'compute ms':>10}{cols}{ratio}  check")
    for r in rows:
        cols = "".join(f" {r[f'{b}_ms']:>10.3f}" for b in backends)
        ratio = f" {r['ratio']:>9.2f}x" if r.get("ratio") is not None else ""
        print(f"{r['model']:>12} {r['params']:>9} {r['tensors']:>7} {r['steps']:>5} {r['compute_ms']:>10.3f}"
              f"{cols}{ratio}  {r['check']}")
    print()
