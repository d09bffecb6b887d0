"""torch.distributed collectives (and DDP steps) timed on several backends in one run.

    python -m shoal.bench --backends shoal,gloo --ops all_reduce,all_gather,broadcast,reduce_scatter,all_to_all \\
        -n 4 -b 4K -e 64M -f 4 [--json FILE] [--plot FILE.png] [--ddp]

Starts n local ranks (spawned processes, env:// rendezvous on 127.0.0.1). Every rank joins one
process group per backend (plus a gloo group of its own for the bookkeeping), so each op runs on
every backend with the same tensors, sizes and iteration count, interleaved size by size. Per op
and size: a warm-up call, an estimate of the time per call, an iteration count chosen so that the
slowest backend takes about --time seconds (0.2), then for each backend a barrier on that group
and the timed loop of synchronous calls (``dist.<op>(..., group=g)`` as user code calls it). The
time is the largest over the ranks of each rank's mean per call. After timing, one call on fresh
data is checked against a reference every rank computes itself ("check" column).

Sizes are nccl-tests': all_reduce and broadcast the tensor; all_gather, reduce_scatter and
all_to_all the total (all_gather's output, reduce_scatter's input, all_to_all's whole tensor).
busbw = algbw (size/time) times 2(p-1)/p for all_reduce, (p-1)/p for all_gather,
reduce_scatter and all_to_all, 1 for broadcast. "PEER/shoal" is a peer's time over shoal's.

Backends: any torch.distributed backend by name (``shoal``, ``gloo``); ``deepspeed``: DeepSpeed's
CPU shared-memory allreduce (all_reduce only; needs ``pip install deepspeed``; shoal.deepspeed_peer
says more); ``shoal_inline``: ``shoal.torch.all_reduce_`` on a shoal group (all_reduce only: the
blocking call without torch.distributed's Python and Work, DeepSpeed's counterpart). Ops a backend
lacks show "-".

--ddp adds DistributedDataParallel training steps: the digits MLP of ``python -m shoal.demo`` and a
wide MLP (~6.3 M parameters, 25 MB of gradients per step), same seed and data on each backend:
the mean step time (forward, backward with its gradient all-reduces, optimizer step), the same
without gradient sync (``no_sync``: the compute alone), and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

if TYPE_CHECKING:
    import torch

from .bench_zero import bench_zero, print_zero
from .deepspeed_peer import DeepSpeedShm

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
ALL_OPS = ["all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all"]
BUSBW_FACTOR = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_to_all": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
}


def parse_size(s: str) -> int:
    s = s.strip().upper().rstrip("B")
    unit = s[-1] if s and s[-1] in UNITS else ""
    return int(float(s[: len(s) - len(unit)]) * UNITS[unit])


def time_in_turns(calls: Dict[str, Callable[[], Any]], n_calls: int, rounds: int, group: Any) -> Dict[str, List[float]]:
    """µs per call of each of `calls` (name -> function), each timed over `n_calls` calls after 20
    warm-up calls and a barrier on `group`, taking turns for `rounds` rounds: {name: [µs, ...]},
    which rank 0 prints, a line per name (the scripts that compare ways of making one call:
    scripts/torch_call_paths.py)."""
    import torch.distributed as dist

    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            for _ in range(20):
                call()
            dist.barrier(group=group)
            start = time.perf_counter()
            for _ in range(n_calls):
                call()
            times[name].append((time.perf_counter() - start) / n_calls * 1e6)
    if dist.get_rank() == 0:
        for name, v in times.items():
            print(f"{name:24s}", " ".join(f"{x:8.1f}" for x in v))
    return times


def fmt_size(n: int) -> str:
    for u, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m}{u}"
    return str(n)


def sizes_from(b: int, e: int, f: int) -> list[int]:
    out, s = [], b
    while s <= e:
        out.append(s)
        s = s * f if f > 1 else s + b
        if f <= 1 and b == 0:
            break
    return out


# ---------------------------------------------------------------------------------------------
# One op at one size on one rank: the tensors, the call, and the check against a reference.


class _Case:
    """float32 tensors for `op` at `nbytes` (total, nccl-tests' convention), rank `r` of `p`."""

    def __init__(self, op: str, nbytes: int, r: int, p: int):
        import torch

        self.op, self.r, self.p = op, r, p
        count = max(1, nbytes // 4)
        if op in ("all_gather", "reduce_scatter", "all_to_all"):
            count = max(p, count // p * p)  # a multiple of p
        self.count = count
        self.bytes = count * 4
        chunk = count // p
        if op == "all_reduce":
            self.a = torch.zeros(count)  # zeros while timing: repeated in-place sums stay finite
        elif op == "broadcast":
            self.a = torch.zeros(count)
        elif op == "all_gather":
            self.a, self.b = torch.zeros(chunk), torch.empty(count)
        elif op == "reduce_scatter":
            self.a, self.b = torch.zeros(count), torch.empty(chunk)
        elif op == "all_to_all":
            self.a, self.b = torch.zeros(count), torch.empty(count)
        else:
            raise ValueError(f"unknown op {op}")

    @staticmethod
    def _pattern(rank: int, n: int, offset: int = 0):
        """Rank `rank`'s data: small integers, exact in float32 when summed over ranks."""
        import torch

        return ((torch.arange(offset, offset + n) % 251) + 256 * rank).float()

    def call(self, g):
        import torch.distributed as dist

        op = self.op
        if not _is_group(g):
            g.all_reduce(self.a)
        elif op == "all_reduce":
            dist.all_reduce(self.a, group=g)
        elif op == "broadcast":
            dist.broadcast(self.a, group_src=0, group=g)
        elif op == "all_gather":  # all_gather_into_tensor before torch 2.13
            getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(self.b, self.a, group=g)
        elif op == "reduce_scatter":  # reduce_scatter_tensor before torch 2.13
            getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(self.b, self.a, group=g)
        elif op == "all_to_all":
            dist.all_to_all_single(self.b, self.a, group=g)

    def check(self, g) -> bool:
        """One call on fresh data, compared with what it must give on this rank."""
        import torch

        op, r, p, n = self.op, self.r, self.p, self.count
        chunk = n // p
        pat = self._pattern
        if op in ("all_reduce", "broadcast", "reduce_scatter", "all_to_all"):
            self.a.copy_(pat(r, n))
        else:
            self.a.copy_(pat(r, chunk, r * chunk))
        if hasattr(self, "b"):
            self.b.fill_(-1)
        self.call(g)
        if op == "all_reduce":
            want, got = sum(pat(s, n) for s in range(p)), self.a
        elif op == "broadcast":
            want, got = pat(0, n), self.a
        elif op == "all_gather":
            want, got = torch.cat([pat(s, chunk, s * chunk) for s in range(p)]), self.b
        elif op == "reduce_scatter":
            want, got = sum(pat(s, n)[r * chunk : (r + 1) * chunk] for s in range(p)), self.b
        else:  # all_to_all: block s of the output is block r of rank s's input
            want, got = torch.cat([pat(s, n)[r * chunk : (r + 1) * chunk] for s in range(p)]), self.b
        ok = torch.equal(got, want)
        if op in ("all_reduce", "broadcast"):
            self.a.zero_()
        return ok


def _agree(ctl, value: float, op) -> float:
    """The max (or min) of a number over the ranks, through the bookkeeping group."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=op, group=ctl)
    return t.item()


class ShoalInline:
    """``shoal.torch.all_reduce_`` on a shoal group of its own, as a backend of the bench."""

    name = "shoal_inline"
    ops = ("all_reduce",)

    def __init__(self):
        import torch.distributed as dist

        import shoal.torch

        self._group = dist.new_group(backend="shoal")
        self._all_reduce_ = shoal.torch.all_reduce_

    def all_reduce(self, t: "torch.Tensor") -> None:
        self._all_reduce_(t, group=self._group)


def _make_group(backend: str, rank: int, p: int):
    import torch.distributed as dist

    if backend == "deepspeed":
        return DeepSpeedShm(rank, p)
    if backend == "shoal_inline":
        return ShoalInline()
    return dist.new_group(backend=backend)


def _is_group(g) -> bool:
    """A process group, rather than a callable peer (all_reduce only)."""
    return not isinstance(g, (DeepSpeedShm, ShoalInline))


def _time_calls(case, g, ctl, k: int) -> float:
    import torch.distributed as dist

    dist.barrier(group=g if _is_group(g) else ctl)
    start = time.perf_counter()
    for _ in range(k):
        case.call(g)
    return (time.perf_counter() - start) / k


def _bench_ops(rank, p, groups, ctl, cfg):
    import torch.distributed as dist

    MAX, MIN = dist.ReduceOp.MAX, dist.ReduceOp.MIN
    rows = []
    for op in cfg["ops"]:
        for nbytes in cfg["sizes"]:
            case = _Case(op, nbytes, rank, p)
            # Estimate the time per call on each backend (after one warm-up call), ranks agreeing.
            timed = {b: g for b, g in groups.items() if _is_group(g) or op in g.ops}
            est = 0.0
            for g in timed.values():
                case.call(g)
                k = 1
                while True:
                    t = _agree(ctl, _time_calls(case, g, ctl, k), MAX)
                    if t * k >= 0.02 or k >= 1000:
                        break
                    k *= 10
                est = max(est, t)
            iters = int(min(cfg["max_iters"], max(cfg["min_iters"], cfg["time"] / max(est, 1e-7))))
            row = {"op": op, "bytes": case.bytes, "iters": iters}
            for b in groups:
                row[f"{b}_us"] = row[f"{b}_busbw"] = None
            for b, g in timed.items():
                us = _agree(ctl, _time_calls(case, g, ctl, iters), MAX) * 1e6
                row[f"{b}_us"] = us
                row[f"{b}_busbw"] = case.bytes / (us * 1e-6) / 1e9 * BUSBW_FACTOR[op](p)
            row["ratios"] = {b: row[f"{b}_us"] / row["shoal_us"] for b in _peers(groups)
                             if row[f"{b}_us"] is not None and row.get("shoal_us") is not None}
            row["ratio"] = row["ratios"].get("gloo")  # gloo/shoal, as before there were other peers
            bad = [b for b, g in timed.items() if _agree(ctl, float(case.check(g)), MIN) < 1]
            row["check"] = "ok" if not bad else "FAIL " + ",".join(bad)
            rows.append(row)
            if rank == 0 and cfg["live"]:
                print(_row_line(row, list(groups)), flush=True)
            del case
    return rows


# ---------------------------------------------------------------------------------------------
# DDP steps


def _wide_mlp(seed=0, width=2048, inputs=1024, outputs=10):
    import torch
    import torch.nn as nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(inputs, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, inputs), nn.ReLU(), nn.Linear(inputs, outputs))


def _bench_ddp(rank, p, groups, ctl, cfg):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    from .demo import BATCH, load_digits_split, make_model

    MAX = dist.ReduceOp.MAX
    x_digits, y_digits, _, _ = load_digits_split()
    per = BATCH // p
    gen = torch.Generator().manual_seed(100 + rank)
    models = [
        ("digits MLP", make_model, x_digits[rank * per : (rank + 1) * per], y_digits[rank * per : (rank + 1) * per],
         cfg["ddp_steps"]),
        ("wide MLP", _wide_mlp, torch.randn(32, 1024, generator=gen), torch.randint(0, 10, (32,), generator=gen),
         max(2, cfg["ddp_steps"] // 4)),
    ]
    groups = {b: g for b, g in groups.items() if _is_group(g)}  # DDP runs on process groups
    rows = []
    for name, build, x, y, steps in models:
        row = {"model": name, "steps": steps}
        for b, g in groups.items():
            model = build()
            row["params"] = sum(q.numel() for q in model.parameters())
            ddp = nn.parallel.DistributedDataParallel(model, process_group=g)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

            def step():
                opt.zero_grad()
                loss = nn.functional.cross_entropy(ddp(x), y)
                loss.backward()
                opt.step()
                return loss

            for _ in range(2):
                step()
            dist.barrier(group=g)
            start = time.perf_counter()
            for _ in range(steps):
                loss = step()
            row[f"{b}_ms"] = _agree(ctl, (time.perf_counter() - start) / steps * 1e3, MAX)
            row[f"{b}_loss"] = _agree(ctl, loss.item(), MAX)
            if "compute_ms" not in row:  # the same steps without gradient sync: compute alone
                with ddp.no_sync():
                    step()
                    dist.barrier(group=g)
                    start = time.perf_counter()
                    for _ in range(steps):
                        step()
                    row["compute_ms"] = _agree(ctl, (time.perf_counter() - start) / steps * 1e3, MAX)
            del ddp, model, opt
        row["ratio"] = row["gloo_ms"] / row["shoal_ms"] if "gloo" in groups and "shoal" in groups else None
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------


def _rank(rank, p, cfg):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import shoal  # noqa: F401  (registers the backend)

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // p))
    # The default group (gloo) is the bookkeeping one; each measured backend has its own group.
    dist.init_process_group("gloo", rank=rank, world_size=p, timeout=timedelta(seconds=cfg["timeout"]))
    try:
        ctl = dist.group.WORLD
        groups = {b: _make_group(b, rank, p) for b in cfg["backends"]}
        dist.barrier()  # every rank has mapped DeepSpeed's segments: their names may go
        for g in groups.values():
            if isinstance(g, DeepSpeedShm):
                g.unlink_name()
        out = {"rows": _bench_ops(rank, p, groups, ctl, cfg)}
        if cfg["ddp"]:
            out["ddp"] = _bench_ddp(rank, p, groups, ctl, cfg)
        if cfg["zero"]:
            out["zero"] = bench_zero(rank, p, {b: g for b, g in groups.items() if _is_group(g)}, ctl, cfg)
        dist.barrier()
        return out if rank == 0 else None
    finally:
        dist.destroy_process_group()


def _peers(backends) -> list:
    """The backends shoal is compared with (a ratio column each), when shoal is measured too."""
    return [b for b in backends if b != "shoal"] if "shoal" in backends else []


def _header(op, p, backends) -> str:
    cols = "".join(f" {b + ' us':>12} {b + ' GB/s':>11}" for b in backends)
    ratios = "".join(f" {b + '/shoal':>10}" for b in _peers(backends))
    return (f"# {op}, {p} ranks, float32; time: max over ranks of the mean per call; busbw GB/s\n"
            f"{'size':>10} {'iters':>6}{cols}{ratios}  check")


def _row_line(row, backends) -> str:
    def num(v, width, prec):
        return f" {'-':>{width}}" if v is None else f" {v:>{width}.{prec}f}"

    cols = "".join(num(row[f"{b}_us"], 12, 1) + num(row[f"{b}_busbw"], 11, 3) for b in backends)
    ratios = "".join(f" {row['ratios'][b]:>9.2f}x" if b in row.get("ratios", {}) else f" {'-':>10}"
                     for b in _peers(backends))
    return f"{fmt_size(row['bytes']):>10} {row['iters']:>6}{cols}{ratios}  {row['check']}"


def print_tables(result: Dict[str, Any]) -> None:
    backends, p = result["backends"], result["ranks"]
    for op in dict.fromkeys(r["op"] for r in result["rows"]):
        print(_header(op, p, backends))
        for row in result["rows"]:
            if row["op"] == op:
                print(_row_line(row, backends))
        print()
    if result.get("ddp"):
        print(f"# DDP training step, {p} ranks: mean step time in ms (max over ranks); "
              "compute = the same step without gradient sync")
        backends = [b for b in backends if f"{b}_ms" in result["ddp"][0]]  # process groups only
        cols = "".join(f" {b + ' ms':>10}" for b in backends)
        ratio = f" {'gloo/shoal':>10}" if "gloo" in backends and "shoal" in backends else ""
        print(f"{'model':>12} {'params':>9} {'steps':>5} {'compute ms':>10}{cols}{ratio}")
        for r in result["ddp"]:
            cols = "".join(f" {r[f'{b}_ms']:>10.2f}" for b in backends)
            ratio = f" {r['ratio']:>9.2f}x" if r.get("ratio") is not None else ""
            print(f"{r['model']:>12} {r['params']:>9} {r['steps']:>5} {r['compute_ms']:>10.2f}{cols}{ratio}")
        print()
    if result.get("zero"):
        print_zero(result["zero"], [b for b in backends if f"{b}_ms" in result["zero"][0]], p)


def plot(result: Dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = list(dict.fromkeys(r["op"] for r in result["rows"]))
    cols = min(3, len(ops))
    nrows = (len(ops) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.8 * nrows), squeeze=False)
    for ax, op in zip(axes.flat, ops):
        rows = [r for r in result["rows"] if r["op"] == op]
        for b in result["backends"]:
            pts = [(r["bytes"], r[f"{b}_busbw"]) for r in rows if r[f"{b}_busbw"] is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=b)
        ax.set_xscale("log", base=2)
        ax.set_xticks([r["bytes"] for r in rows], [fmt_size(r["bytes"]) for r in rows], fontsize=7)
        ax.set_title(f"{op}, {result['ranks']} ranks")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    for ax in list(axes.flat)[len(ops):]:
        ax.set_visible(False)
    fig.suptitle("torch.distributed on CPU: busbw by backend")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shoal.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--ranks", type=int, default=2, help="ranks (local processes)")
    p.add_argument("--backends", default="shoal,gloo")
    p.add_argument("--ops", default="all_reduce", help=f"comma separated, or 'all': {','.join(ALL_OPS)}")
    p.add_argument("-b", "--minbytes", default="4K", help="smallest size (K, M, G)")
    p.add_argument("-e", "--maxbytes", default="64M", help="largest size")
    p.add_argument("-f", "--stepfactor", type=int, default=4, help="size multiplier between rows")
    p.add_argument("--sizes", default=None, help="explicit sizes instead of -b/-e/-f, comma separated")
    p.add_argument("--time", type=float, default=0.2, help="seconds of timed calls per size (slowest backend)")
    p.add_argument("--min-iters", type=int, default=2)
    p.add_argument("--max-iters", type=int, default=10000)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--plot", default=None, help="write a PNG of busbw against size here")
    p.add_argument("--ddp", action="store_true", help="also time DDP training steps")
    p.add_argument("--ddp-steps", type=int, default=40, help="timed steps of the small model (a quarter for the wide one)")
    p.add_argument("--zero", action="store_true",
                   help="also time ZeroRedundancyOptimizer steps (one async broadcast per parameter from its owner)")
    p.add_argument("--zero-steps", type=int, default=40, help="timed ZeRO steps of the small model (others scaled)")
    p.add_argument("--timeout", type=float, default=600, help="process group timeout, seconds")
    a = p.parse_args(argv)

    ops = ALL_OPS if a.ops == "all" else [o.strip() for o in a.ops.split(",") if o.strip()]
    for o in ops:
        if o not in ALL_OPS:
            p.error(f"unknown op {o!r} (one of {', '.join(ALL_OPS)})")
    backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    if "deepspeed" in backends and (why := DeepSpeedShm.missing()):
        p.error(why)
    sizes = ([parse_size(s) for s in a.sizes.split(",")] if a.sizes
             else sizes_from(parse_size(a.minbytes), parse_size(a.maxbytes), a.stepfactor))
    live = len(ops) == 1  # one op: print rows as they come; several: a table per op at the end
    cfg = dict(ops=ops, sizes=sizes, backends=backends, time=a.time, min_iters=a.min_iters,
               max_iters=a.max_iters, ddp=a.ddp, ddp_steps=a.ddp_steps, zero=a.zero, zero_steps=a.zero_steps,
               timeout=a.timeout, live=live)

    from ._launch import launch

    if live:
        print(_header(ops[0], a.ranks, backends), flush=True)
    start = time.perf_counter()
    out = launch(_rank, a.ranks, cfg)[0]
    result = {"ranks": a.ranks, "backends": backends, "rows": out["rows"]}
    if a.ddp:
        result["ddp"] = out["ddp"]
    if a.zero:
        result["zero"] = out["zero"]
    if live:
        print()
        if a.ddp or a.zero:
            print_tables({**result, "rows": []})
    else:
        print_tables(result)
    print(f"# {time.perf_counter() - start:.1f} s, {os.cpu_count()} cores")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    if a.plot:
        plot(result, a.plot)
    return 0 if all(r["check"] == "ok" for r in result["rows"] + result.get("zero", [])) else 1


if __name__ == "__main__":
    raise SystemExit(main())
