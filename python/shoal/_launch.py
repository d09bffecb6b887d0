"""Start N local ranks (spawned processes, env:// rendezvous on 127.0.0.1) and collect what each
returns. Used by ``python -m shoal.bench`` and ``python -m shoal.demo``; no process group is
created here: the rank function does that itself (MASTER_ADDR/PORT, RANK, WORLD_SIZE are set).
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import socket
import time
import traceback


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn, rank, world_size, port, args, conn):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size)
    )
    try:
        conn.send(("ok", fn(rank, world_size, *args)))
    except BaseException:  # noqa: BLE001
        conn.send(("err", traceback.format_exc()))


def launch(fn, world_size: int, *args, timeout: float = 1800.0) -> list:
    """Runs ``fn(rank, world_size, *args)`` on `world_size` fresh processes; returns the results
    by rank. Raises RuntimeError with every failing rank's traceback."""
    ctx = mp.get_context("spawn")
    port = free_port()
    conns, procs = [], []
    for rank in range(world_size):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_entry, args=(fn, rank, world_size, port, args, child), daemon=True)
        p.start()
        child.close()
        conns.append(parent)
        procs.append(p)
    results, errors = [None] * world_size, []
    pending = dict(zip(conns, range(world_size)))
    deadline = time.monotonic() + timeout
    try:
        while pending:
            # After a failure the others may wait forever in a collective: give them a moment.
            left = deadline - time.monotonic()
            if errors:
                left = min(left, 5.0)
            ready = mp_connection.wait(list(pending), timeout=max(0.0, left))
            if not ready:
                errors.extend(f"rank {r}: no answer (timeout or stuck after a failure)" for r in pending.values())
                break
            for conn in ready:
                rank = pending.pop(conn)
                try:
                    status, value = conn.recv()
                except EOFError:
                    errors.append(f"rank {rank}: died (exit code {procs[rank].exitcode})")
                    continue
                if status == "ok":
                    results[rank] = value
                else:
                    errors.append(f"rank {rank}:\n{value}")
    finally:
        for p in procs:
            p.join(5 if not errors else 0.5)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise RuntimeError(f"{getattr(fn, '__name__', fn)} failed:\n" + "\n".join(errors))
    return results
