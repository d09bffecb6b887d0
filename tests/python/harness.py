"""Run test code on N ranks of a torch.distributed process group on the shoal backend.

`Group(n)` spawns n worker processes that join one default process group
(`init_process_group("shoal")`, env:// rendezvous on a free port) and then wait for work:
`group.run(fn, *args)` calls `fn(rank, world_size, *args)` on every rank and returns the list
of results, or raises with every failing rank's traceback. Functions must be importable
(module level in a test file). Starting processes that import torch costs seconds, so a group
is kept for many tests; tests that kill ranks or re-initialise start their own with `spawn`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import traceback
from datetime import timedelta

DEFAULT_TIMEOUT = 120.0  # seconds a test case may take on every rank


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank: int, world_size: int, port: int, pg_timeout: float) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import torch.distributed as dist

    import shoal  # noqa: F401  (registers the backend)

    dist.init_process_group(
        "shoal", rank=rank, world_size=world_size, timeout=timedelta(seconds=pg_timeout)
    )


def _worker(rank: int, world_size: int, port: int, pg_timeout: float, conn) -> None:
    try:
        _init(rank, world_size, port, pg_timeout)
        conn.send(("ok", None))
    except BaseException:  # noqa: BLE001
        conn.send(("err", traceback.format_exc()))
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
        try:
            conn.send(("ok", fn(rank, world_size, *args)))
        except BaseException:  # noqa: BLE001
            conn.send(("err", traceback.format_exc()))
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    conn.close()


class RankFailure(AssertionError):
    pass


def _collect(conns, procs, timeout: float, what: str):
    results, errors = [None] * len(conns), []
    for rank, conn in enumerate(conns):
        if not conn.poll(timeout):
            errors.append(f"rank {rank}: no answer within {timeout:.0f} s ({what})")
            continue
        try:
            status, value = conn.recv()
        except EOFError:
            errors.append(f"rank {rank}: died (exit code {procs[rank].exitcode}) during {what}")
            continue
        if status == "ok":
            results[rank] = value
        else:
            errors.append(f"rank {rank}:\n{value}")
    return results, errors


class Group:
    def __init__(self, world_size: int, pg_timeout: float = 60.0):
        self.world_size = world_size
        self.broken = False
        ctx = mp.get_context("spawn")
        port = free_port()
        self.conns, self.procs = [], []
        for rank in range(world_size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(rank, world_size, port, pg_timeout, child), daemon=True)
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        _, errors = _collect(self.conns, self.procs, DEFAULT_TIMEOUT, "init_process_group")
        if errors:
            self.close()
            raise RankFailure("\n".join(errors))

    def run(self, fn, *args, timeout: float = DEFAULT_TIMEOUT):
        if self.broken:
            raise RankFailure("the group is broken by an earlier failure")
        for conn in self.conns:
            conn.send((fn, args))
        results, errors = _collect(self.conns, self.procs, timeout, fn.__name__)
        if errors:
            # A rank that failed may have left its peers in a collective: start afresh next time.
            self.broken = True
            raise RankFailure(f"{fn.__name__} failed on {len(errors)} rank(s):\n" + "\n".join(errors))
        return results

    def close(self):
        for conn in self.conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()


def _spawn_entry(fn, rank, world_size, port, args, conn):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    try:
        conn.send(("ok", fn(rank, world_size, *args)))
    except BaseException:  # noqa: BLE001
        conn.send(("err", traceback.format_exc()))


def spawn(fn, world_size: int, *args, timeout: float = DEFAULT_TIMEOUT, allow_exit=()):
    """Runs fn(rank, world_size, *args) in fresh processes (MASTER_ADDR/PORT, RANK, WORLD_SIZE set;
    no process group). Returns the results; ranks in `allow_exit` may die without answering
    (their result is None)."""
    ctx = mp.get_context("spawn")
    port = free_port()
    conns, procs = [], []
    for rank in range(world_size):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_spawn_entry, args=(fn, rank, world_size, port, args, child), daemon=True)
        p.start()
        child.close()
        conns.append(parent)
        procs.append(p)
    results, errors = [None] * world_size, []
    try:
        for rank, conn in enumerate(conns):
            if not conn.poll(timeout):
                errors.append(f"rank {rank}: no answer within {timeout:.0f} s")
                continue
            try:
                status, value = conn.recv()
            except EOFError:
                if rank not in allow_exit:
                    errors.append(f"rank {rank}: died (exit code {procs[rank].exitcode})")
                continue
            if status == "ok":
                results[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise RankFailure(f"{fn.__name__} failed:\n" + "\n".join(errors))
    return results
