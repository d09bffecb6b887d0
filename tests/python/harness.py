"""Run test code on N ranks of a torch.distributed process group on the shoal backend.

`Group(n)` spawns n worker processes that join one default process group
(`init_process_group("shoal")`, env:// rendezvous on a free port) and then wait for work:
`group.run(fn, *args)` calls `fn(rank, world_size, *args)` on every rank and returns the list
of results, or raises with every failing rank's traceback. Functions must be importable
(module level in a test file). Starting processes that import torch costs seconds, so a group
is kept for many tests; tests that kill ranks or re-initialise start their own with `spawn`.

Processes are started, and their answers collected, by the package's launcher (`shoal._launch`).

``SHOAL_TEST_DEVICE=cuda`` runs every `group.run` with torch's default device set to the rank's
GPU, so that the tensors the test functions make are CUDA tensors: scripts/cuda_check.sh runs the
pooled suites again that way on a GPU machine. Unset (CI): the CPU.
"""

from __future__ import annotations

import os
import subprocess
from datetime import timedelta

from shoal._launch import Ranks, RankFailure, answer, free_port, launch

__all__ = ["DEFAULT_TIMEOUT", "Group", "RankFailure", "can_make_containers", "container_argv", "free_port", "spawn"]

DEFAULT_TIMEOUT = 120.0  # seconds a test case may take on every rank
TEST_DEVICE = os.environ.get("SHOAL_TEST_DEVICE", "cpu")


def _on_device(rank: int, world_size: int, device_type: str, fn, *args):
    """fn(rank, world_size, *args) with torch's default device set to this rank's device of
    `device_type` (ranks share the GPUs there are, round robin)."""
    import torch

    if device_type == "cpu":
        return fn(rank, world_size, *args)
    mod = getattr(torch, device_type)
    if not mod.is_available():
        raise RuntimeError(f"SHOAL_TEST_DEVICE={device_type}, but torch sees no {device_type} device")
    dev = torch.device(device_type, rank % mod.device_count())
    mod.set_device(dev)
    before = torch.get_default_device()
    torch.set_default_device(dev)
    try:
        return fn(rank, world_size, *args)
    finally:
        torch.set_default_device(before)


def _init(rank: int, world_size: int, pg_timeout: float) -> None:
    import torch.distributed as dist

    import shoal  # noqa: F401  (registers the backend)

    dist.init_process_group(
        "shoal", rank=rank, world_size=world_size, timeout=timedelta(seconds=pg_timeout)
    )


def _worker(conn, rank: int, world_size: int, pg_timeout: float) -> None:
    """A pool rank: answers once for init_process_group, then once per (fn, args) received,
    until the parent closes the pipe (or sends None)."""
    if not answer(conn, _init, rank, world_size, pg_timeout):
        return
    import torch.distributed as dist

    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            break
        fn, args = msg
        answer(conn, fn, rank, world_size, *args)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    conn.close()


class Group:
    def __init__(self, world_size: int, pg_timeout: float = 60.0):
        self.world_size = world_size
        self.ranks = Ranks(_worker, world_size, pg_timeout)
        try:
            self.ranks.collect(DEFAULT_TIMEOUT, "init_process_group")
        except BaseException:
            self.close()
            raise

    @property
    def broken(self) -> bool:
        # A rank that failed may have left its peers in a collective: start afresh next time.
        return self.ranks.failed

    def run(self, fn, *args, timeout: float = DEFAULT_TIMEOUT):
        if self.broken:
            raise RankFailure("the group is broken by an earlier failure")
        self.ranks.send((_on_device, (TEST_DEVICE, fn, *args)))
        return self.ranks.collect(timeout, fn.__name__)

    def close(self):
        self.ranks.close()


def spawn(fn, world_size: int, *args, timeout: float = DEFAULT_TIMEOUT, allow_exit=()):
    """Runs fn(rank, world_size, *args) in fresh processes (MASTER_ADDR/PORT, RANK, WORLD_SIZE set;
    no process group). Returns the results; ranks in `allow_exit` may die without answering
    (their result is None)."""
    return launch(fn, world_size, *args, timeout=timeout, allow_exit=allow_exit)


# A container: its own IPC and mount namespaces with a /dev/shm of `size`; the network stays the
# host's (as with Docker's host network, or a bridge: what matters here is /dev/shm).
_CONTAINER = "mount --make-rprivate / && mount -t tmpfs -o size={size} tmpfs /dev/shm && exec \"$@\""


def container_argv(size: str) -> list:
    """The words that run the command after them in a container with a /dev/shm of `size`."""
    return ["unshare", "--mount", "--ipc", "sh", "-c", _CONTAINER.format(size=size), "sh"]


def can_make_containers() -> bool:
    try:
        return subprocess.run([*container_argv("1m"), "true"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
