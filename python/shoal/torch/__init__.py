"""shoal as a torch.distributed backend.

Importing this module (``import shoal`` does) registers the backend ``"shoal"``::

    import shoal
    import torch.distributed as dist
    dist.init_process_group("shoal")      # or "cpu:shoal,cuda:nccl"

The backend itself is C++ (``shoal._C.BackendShoal``, a ``c10d::Backend``); this module only
registers its creator with :meth:`torch.distributed.Backend.register_backend`.
"""

from __future__ import annotations

import torch.distributed as dist

from .. import _C

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


def is_shoal_group(group=None) -> bool:
    """Whether `group` (default: the default group) runs on shoal for CPU tensors."""
    import torch

    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    try:
        return isinstance(pg._get_backend(torch.device("cpu")), BackendShoal)
    except RuntimeError:
        return False


def monitored_barrier(group=None, timeout=None, wait_all_ranks: bool = False) -> None:
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


register()

__all__ = ["BackendShoal", "Options", "register", "is_shoal_group", "monitored_barrier", "BACKEND_NAME"]
