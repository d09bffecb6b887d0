"""Start N local ranks (fresh processes, forked from a server that has imported torch; env://
rendezvous on 127.0.0.1) and collect what each answers. The one way this package and its tests
start Python ranks: ``python -m shoal.bench`` and ``python -m shoal.demo`` call `launch`; the
pytest harness (``tests/python/harness.py``) calls `launch` for one-shot ranks and builds its pool
of long-lived ranks on `Ranks`. No process group is created here: the rank code does that itself
(MASTER_ADDR/PORT, RANK, WORLD_SIZE are set).

A rank talks to the parent over a pipe: each answer is ``("ok", value)`` or ``("err", traceback)``
(`answer` sends one); a rank that exits without answering is reported as dead.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import socket
import time
import traceback

# After one rank fails the others may wait forever in a collective: how long they still get.
FAILURE_GRACE = 5.0


class RankFailure(RuntimeError):
    """Raised in the parent when ranks fail: the message holds every failing rank's traceback,
    or what became of it (died, no answer)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answer(conn, fn, *args) -> bool:
    """In a rank: sends ``fn(*args)``'s result on `conn`, or its traceback if it raises (or the
    result does not pickle). Returns whether it succeeded and the parent got the answer."""
    try:
        reply = ("ok", fn(*args))
    except BaseException:  # noqa: BLE001
        reply = ("err", traceback.format_exc())
    try:
        try:
            conn.send(reply)
        except OSError:
            raise
        except Exception:  # noqa: BLE001  a result that does not pickle
            reply = ("err", traceback.format_exc())
            conn.send(reply)
    except OSError:  # the parent closed the pipe: it gave up on this rank after a failure
        return False
    return reply[0] == "ok"


# Ranks are forked from a server process that has imported these once (multiprocessing's
# forkserver), rather than spawned: a spawned rank imports torch again, seconds of CPU each, and
# with ranks outnumbering cores that was most of the time of a short job (and of the test suite).
# The server forks before anything runs a torch op, so no thread pool is copied.
PRELOAD = ["torch", "torch.distributed"]


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # no effect once the server runs; it is started once
    return ctx


def _main(serve, rank, world_size, port, conn, env, args):
    # The server's environment is the one it started with: take the parent's, as a spawned
    # process would.
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size)
    )
    serve(conn, rank, world_size, *args)


def _once(conn, rank, world_size, fn, *args):
    answer(conn, fn, rank, world_size, *args)
    # A tensor in the answer travels as a file descriptor that this process hands over while the
    # parent unpickles it: stay until the parent closes the pipe (Ranks.close), as a serving rank
    # does. (Leaving at once, the parent found no one to take it from: FileNotFoundError.)
    try:
        conn.recv()
    except (EOFError, OSError):
        pass


class Ranks:
    """`world_size` fresh processes, each running ``serve(conn, rank, world_size, *args)`` with
    the rendezvous environment set and `conn` its end of a pipe to the parent. `serve` must be
    importable (module level); it answers with `answer` as often as the protocol it speaks wants,
    and should return when `conn` reaches EOF (`close` closes the parent's ends)."""

    def __init__(self, serve, world_size: int, *args):
        self.world_size = world_size
        self.failed = False
        ctx = _context()
        port = free_port()
        env = dict(os.environ)
        self.conns, self.procs = [], []
        try:
            for rank in range(world_size):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_main, args=(serve, rank, world_size, port, child, env, args), daemon=True)
                p.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(p)
        except BaseException:
            self.close(0.5)
            raise

    def send(self, msg) -> None:
        """Sends `msg` to every rank; a rank that is gone makes it raise RankFailure."""
        for rank, conn in enumerate(self.conns):
            try:
                conn.send(msg)
            except OSError as e:
                self.failed = True
                raise RankFailure(f"rank {rank}: gone (exit code {self.procs[rank].exitcode}): {e}") from None

    def collect(self, timeout: float, what: str, allow_exit=()) -> list:
        """Waits for one answer from every rank (at most `timeout` seconds in all, and only
        FAILURE_GRACE more once a rank has failed); returns the values by rank. Ranks in
        `allow_exit` may exit without answering (their value is None). Raises RankFailure naming
        `what` and every failing rank; the ranks are then in an unknown state (`failed` is set)."""
        results, errors = [None] * self.world_size, {}
        pending = dict(zip(self.conns, range(self.world_size)))
        deadline = time.monotonic() + timeout
        while pending:
            left = deadline - time.monotonic()
            if errors:
                left = min(left, FAILURE_GRACE)
            ready = mp_connection.wait(list(pending), timeout=max(0.0, left))
            if not ready:
                why = ("no answer (stuck after another rank's failure?)" if errors
                       else f"no answer within {timeout:.0f} s")
                errors.update((rank, f"rank {rank}: {why}") for rank in pending.values())
                break
            for conn in ready:
                rank = pending.pop(conn)
                try:
                    status, value = conn.recv()
                except EOFError:
                    if rank not in allow_exit:
                        self.procs[rank].join(0.5)  # for its exit code
                        errors[rank] = f"rank {rank}: died (exit code {self.procs[rank].exitcode})"
                    continue
                if status == "ok":
                    results[rank] = value
                else:
                    errors[rank] = f"rank {rank}:\n{value}"
        if errors:
            self.failed = True
            raise RankFailure(
                f"{what} failed on {len(errors)} of {self.world_size} rank(s):\n"
                + "\n".join(errors[rank] for rank in sorted(errors))
            )
        return results

    def close(self, grace: float | None = None) -> None:
        """Closes the pipes (a serving rank sees EOF), gives the processes `grace` seconds in all
        to exit (default 10, 0.5 after a failure), then kills what is left."""
        if grace is None:
            grace = 0.5 if self.failed else 10.0
        for conn in self.conns:
            conn.close()
        deadline = time.monotonic() + grace
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def launch(fn, world_size: int, *args, timeout: float = 1800.0, allow_exit=()) -> list:
    """Runs ``fn(rank, world_size, *args)`` on `world_size` fresh processes; returns the results
    by rank. Ranks in `allow_exit` may exit without answering (their result is None). Raises
    RankFailure (a RuntimeError) with every failing rank's traceback."""
    with Ranks(_once, world_size, fn, *args) as ranks:
        return ranks.collect(timeout, getattr(fn, "__name__", repr(fn)), allow_exit)
