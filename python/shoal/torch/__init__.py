"""shoal as a torch.distributed backend.

Importing this module (``import shoal`` does) registers the backend ``"shoal"``::

    import shoal
    import torch.distributed as dist
    dist.init_process_group("shoal")      # or "cpu:shoal,cuda:nccl"

The backend itself is C++ (``shoal._C.BackendShoal``, a ``c10d::Backend``); this module only
registers its creator with :meth:`torch.distributed.Backend.register_backend`.
"""

from __future__ import annotations

import datetime
from typing import Any, Optional

import torch
import torch.distributed as dist

from .._torch_abi import check as _check_torch

_check_torch(torch.__version__)

from .. import _C  # noqa: E402  (after the check)

BackendShoal = _C.BackendShoal
Options = _C.BackendShoal.Options

BACKEND_NAME = "shoal"
DEVICES = ["cpu", "cuda"]  # cuda tensors are staged through pinned host memory


def _create_backend(dist_backend_opts, pg_options=None):
    """Creator torch.distributed calls (extended API: store, ranks, timeout, group id)."""
    return _C._create_backend(dist_backend_opts, pg_options)


def register() -> None:
    """Register the "shoal" backend with torch.distributed (idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=DEVICES)


def is_shoal_group(group: Optional[dist.ProcessGroup] = None) -> bool:
    """Whether `group` (default: the default group) runs on shoal for CPU tensors."""
    import torch

    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    try:
        return isinstance(pg._get_backend(torch.device("cpu")), BackendShoal)
    except RuntimeError:
        return False


def monitored_barrier(group: Optional[dist.ProcessGroup] = None, timeout: Optional[datetime.timedelta] = None,
                      wait_all_ranks: bool = False) -> None:
    """torch.distributed.monitored_barrier for shoal groups (torch's Python function accepts only
    gloo groups; the C++ backend implements the op as gloo does, through the store): rank 0
    raises naming the ranks that did not arrive within `timeout`."""
    from datetime import timedelta

    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if timeout is None:
        timeout = dist.distributed_c10d._get_default_timeout(BACKEND_NAME)
    elif not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


_inline: dict = {}  # the last group argument of all_reduce_ -> (its process group, its shoal backend)
_SUM = dist.ReduceOp.SUM
_SUM_OP = dist.ReduceOp(_SUM)  # what the backend takes (made once: each conversion costs ~1 us)


def _inline_entry(group):
    """(process group, shoal backend) for all_reduce_'s `group`, or ValueError."""
    import torch

    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if pg is dist.GroupMember.NON_GROUP_MEMBER:
        return pg, None
    try:
        backend = pg._get_backend(torch.device("cpu"))
    except RuntimeError as e:
        raise ValueError(f"shoal.torch.all_reduce_: the group has no CPU backend ({e})") from None
    if not isinstance(backend, BackendShoal):
        raise ValueError(f"shoal.torch.all_reduce_: the group runs on {type(backend).__name__}, not shoal")
    _inline.clear()
    _inline[group] = (pg, backend)
    return pg, backend


def all_reduce_(tensor: torch.Tensor, op: Any = _SUM, group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """``torch.distributed.all_reduce(tensor, op, group)`` for a contiguous CPU tensor on a shoal
    group, without torch.distributed's Python, Work or future: the op runs on this thread and is
    done when this returns (as DeepSpeed's ``inference_all_reduce_``, for CPU tensor-parallel
    inference, where a small all_reduce per layer makes torch's per-call cost count). Other tensors
    (not contiguous, not on the CPU, sparse, complex, a conjugate or negative view, a zero tensor,
    a tensor subclass) go through ``torch.distributed.all_reduce``.
    Returns `tensor`."""
    entry = _inline.get(group)
    # The default group is looked up again when it changed (destroyed and made anew).
    if entry is None or (group is None and entry[0] is not dist.distributed_c10d._world.default_pg):
        entry = _inline_entry(group)
    pg, backend = entry
    if backend is None:  # not a member of the group: nothing to do here, as dist.all_reduce
        return tensor
    rop = _SUM_OP if op is _SUM else op if isinstance(op, dist.ReduceOp) else dist.ReduceOp(op)
    if not backend.allreduce_inline(tensor, rop):
        dist.all_reduce(tensor, op, group=pg)
    return tensor


register()

__all__ = ["BackendShoal", "Options", "register", "is_shoal_group", "monitored_barrier", "all_reduce_", "BACKEND_NAME"]
