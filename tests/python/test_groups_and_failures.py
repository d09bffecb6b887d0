"""Subgroups, re-initialisation, torchrun, and failures: a killed peer and a timeout must raise in
the survivors, never hang."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from harness import free_port, spawn

HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------- subgroups


def w_subgroups(rank, n):
    import shoal.torch

    pairs = [dist.new_group([r, r + 1]) for r in range(n - 1)]  # overlapping pairs
    evens = dist.new_group([r for r in range(n) if r % 2 == 0])
    rev = dist.new_group(list(reversed(range(n))))  # torch sorts the ranks: same order as global
    assert shoal.torch.is_shoal_group(rev)
    for it in range(3):
        for r, g in enumerate(pairs):
            if rank in (r, r + 1):
                t = torch.tensor([float(rank + it)])
                dist.all_reduce(t, group=g)
                assert t.item() == 2 * r + 1 + 2 * it
        if rank % 2 == 0:
            t = torch.tensor([float(rank)])
            dist.all_reduce(t, group=evens)
            assert t.item() == sum(r for r in range(n) if r % 2 == 0)
            b = torch.tensor([float(rank)])
            dist.broadcast(b, src=max(r for r in range(n) if r % 2 == 0), group=evens)
            assert b.item() == max(r for r in range(n) if r % 2 == 0)
        outs = [torch.zeros(1) for _ in range(n)]
        dist.all_gather(outs, torch.tensor([float(rank)]), group=rev)
        assert [o.item() for o in outs] == [float(dist.get_global_rank(rev, i)) for i in range(n)]
        w1 = dist.all_reduce(torch.ones(2), async_op=True)  # default group and a subgroup interleaved
        w2 = dist.all_reduce(torch.ones(2), group=rev, async_op=True)
        w2.wait()
        w1.wait()
    if n >= 2:
        # send/recv inside a subgroup addresses global ranks (group_dst for group ranks)
        g = pairs[0]
        if rank == 0:
            dist.send(torch.tensor([42.0]), dst=1, group=g)
        elif rank == 1:
            t = torch.zeros(1)
            dist.recv(t, src=0, group=g)
            assert t.item() == 42.0
    for g in pairs + [evens, rev]:
        if g != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(g)
    dist.barrier()


def w_split_and_subgroups_by_enumeration(rank, n):
    cur, groups = dist.new_subgroups_by_enumeration([[r for r in range(n) if r % 2 == k] for k in range(2)])
    t = torch.tensor([1.0])
    dist.all_reduce(t, group=cur)
    assert t.item() == len([r for r in range(n) if r % 2 == rank % 2])
    cur2, _ = dist.new_subgroups(group_size=1)
    t = torch.tensor([5.0])
    dist.all_reduce(t, group=cur2)
    assert t.item() == 5.0


def w_pg_options(rank, n):
    import shoal.torch

    opts = shoal.torch.Options()
    opts.transport = "tcp"
    opts.tcp_streams = 2
    g = dist.new_group(list(range(n)), pg_options=opts)
    be = g._get_backend(torch.device("cpu"))
    assert be.options.transport == "tcp" and be.options.tcp_streams == 2
    tr = be.transports()
    assert all(t == "tcp" for i, t in enumerate(tr) if i != rank), tr
    t = torch.full((100_000,), float(rank))
    dist.all_reduce(t, group=g)
    assert torch.all(t == n * (n - 1) / 2)
    c = torch.complex(torch.ones(4), torch.full((4,), float(rank)))
    dist.all_reduce(c, group=g)  # torch reduces complex as float pairs
    assert torch.equal(c, torch.complex(torch.full((4,), float(n)), torch.full((4,), n * (n - 1) / 2)))
    dist.destroy_process_group(g)


def test_pg_options_tcp_transport(group):
    group.run(w_pg_options)


def test_subgroups(group):
    group.run(w_subgroups)


def test_new_subgroups(group2):
    if group2.world_size % 2:
        pytest.skip("new_subgroups_by_enumeration with 2 equal halves needs an even world size")
    group2.run(w_split_and_subgroups_by_enumeration)


# ---------------------------------------------------------------- re-initialisation


def f_reinit(rank, n):
    import shoal  # noqa: F401

    for it in range(3):
        dist.init_process_group("shoal", rank=rank, world_size=n)
        t = torch.tensor([float(rank + it)])
        dist.all_reduce(t)
        assert t.item() == sum(range(n)) + n * it
        sub = dist.new_group(list(range(n)))
        dist.all_reduce(t, group=sub)
        dist.destroy_process_group()
        assert not dist.is_initialized()
    return "ok"


def test_destroy_and_init_again():
    assert spawn(f_reinit, 2) == ["ok", "ok"]


def f_destroy_right_after_an_op(rank, n, rounds, store_dir):
    import shoal  # noqa: F401

    for it in range(rounds):
        # A store per round: with env:// rank 0's TCPStore server of round k goes away when rank 0
        # destroys its group, and a slower rank could still reach it there for round k+1 (with
        # any backend); that is not what this test is about.
        init = f"file://{os.path.join(store_dir, str(it))}"
        dist.init_process_group("shoal", init_method=init, rank=rank, world_size=n)
        # 4 MiB: the chunked shared-memory allreduce; a rank may leave while its peers still
        # copy out its last chunk.
        t = torch.full((1 << 20,), float(rank + it))
        dist.all_reduce(t)
        want = float(sum(range(n)) + n * it)
        assert torch.all(t == want), (it, t[:4], want)
        dist.destroy_process_group()  # at once: peers may still be finishing the all_reduce
    return "ok"


def test_destroy_right_after_an_op(tmp_path):
    """8 ranks (more than this machine's cores), each destroying its group the moment its
    all_reduce returns: no peer's all_reduce fails for it (tests/test_failure.cpp,
    LeaveRightAfterOp, does the same in C++ over every op)."""
    assert spawn(f_destroy_right_after_an_op, 8, 5, str(tmp_path), timeout=120) == ["ok"] * 8


def f_callback_drops_the_last_work(rank, n):
    """Futures' callbacks run on the backend's completion thread. Once the group is destroyed the
    Works own that thread, and a callback may drop the last of them there: the thread then outlives
    its owner, and still runs the callbacks queued behind."""
    import gc
    import threading
    import time

    import shoal  # noqa: F401

    dist.init_process_group("shoal", rank=rank, world_size=n)
    if rank == 1:
        time.sleep(0.5)  # rank 0's ops are pending when it registers its callbacks
        for _ in range(2):
            dist.all_reduce(torch.ones(4))
        dist.destroy_process_group()
        return "ok"
    ran, go = [], threading.Event()
    holder = [dist.all_reduce(torch.ones(4), async_op=True) for _ in range(2)]

    def first(f):
        go.wait(30)  # until the group is gone
        holder.clear()  # the last Works, and with them the completion thread's owner
        ran.append(1)

    futs = [holder[0].get_future().then(first), holder[1].get_future().then(lambda f: ran.append(2))]
    dist.destroy_process_group()  # the ops complete; their callbacks queue on the completion thread
    gc.collect()
    go.set()
    deadline = time.monotonic() + 30
    while len(ran) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran == [1, 2], ran
    del futs
    return "ok"


def test_callback_drops_the_last_work():
    assert spawn(f_callback_drops_the_last_work, 2, timeout=90) == ["ok", "ok"]


def f_mixed_backends(rank, n):
    import shoal  # noqa: F401

    dist.init_process_group("cpu:shoal", rank=rank, world_size=n)
    gloo = dist.new_group(backend="gloo")
    t1, t2 = torch.arange(4.0) * (rank + 1), torch.arange(4.0) * (rank + 1)
    dist.all_reduce(t1)
    dist.all_reduce(t2, group=gloo)
    assert torch.equal(t1, t2)
    dist.destroy_process_group()


def test_alongside_gloo():
    spawn(f_mixed_backends, 3)


# ---------------------------------------------------------------- failures


def f_killed_peer(rank, n):
    import shoal  # noqa: F401

    dist.init_process_group("shoal", rank=rank, world_size=n, timeout=timedelta(seconds=60))
    t = torch.ones(1000)
    dist.all_reduce(t)
    if rank == n - 1:
        os._exit(0)  # dies without a word
    start = time.monotonic()
    try:
        for _ in range(100):
            dist.all_reduce(t)
    except RuntimeError as e:
        elapsed = time.monotonic() - start
        msg = str(e)
        assert "shoal" in msg and "all_reduce" in msg.lower().replace("allreduce", "all_reduce"), msg
        # Later ops fail at once too.
        try:
            dist.all_reduce(t)
        except RuntimeError:
            pass
        else:
            raise AssertionError("the group should stay failed")
        return elapsed, type(e).__name__, msg
    raise AssertionError("all_reduce with a dead peer did not raise")


def test_killed_peer_raises_in_survivors():
    res = spawn(f_killed_peer, 3, allow_exit={2}, timeout=90)
    for elapsed, kind, msg in res[:2]:
        assert elapsed < 30, (elapsed, msg)  # well under the 60 s group timeout
        assert kind == "DistBackendError", (kind, msg)


def _wait_for_file(path, limit_s):
    """Sleeps until `path` exists (another rank is done) or `limit_s` passed."""
    deadline = time.monotonic() + limit_s
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def f_timeout(rank, n, done_path):
    import shoal  # noqa: F401

    dist.init_process_group("shoal", rank=rank, world_size=n, timeout=timedelta(seconds=3))
    dist.barrier()
    if rank == 1:
        # Misses the all_reduce, alive (so rank 0 times out rather than sees it leave) until
        # rank 0 is done.
        _wait_for_file(done_path, 20)
        return None
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(10))
    except RuntimeError as e:
        return time.monotonic() - start, str(e)
    finally:
        open(done_path, "w").close()
    raise AssertionError("all_reduce should time out")


def test_timeout(tmp_path):
    res = spawn(f_timeout, 2, str(tmp_path / "done"), timeout=60)
    elapsed, msg = res[0]
    assert 2.5 < elapsed < 15, (elapsed, msg)
    assert "timed out" in msg, msg


def f_work_wait_timeout(rank, n):
    import shoal  # noqa: F401

    dist.init_process_group("shoal", rank=rank, world_size=n, timeout=timedelta(seconds=20))
    if rank == 0:
        w = dist.all_reduce(torch.ones(4), async_op=True)
        try:
            w.wait(timeout=timedelta(milliseconds=300))
        except RuntimeError as e:
            assert "timed out" in str(e).lower(), e
        else:
            raise AssertionError("wait(timeout) should raise")
        dist.barrier()  # tell rank 1 to go on; the all_reduce then completes
        w.wait()
    else:
        time.sleep(1.5)
        dist.all_reduce(torch.ones(4))
        dist.barrier()
    dist.destroy_process_group()


def test_work_wait_timeout():
    spawn(f_work_wait_timeout, 2, timeout=60)


def f_monitored_barrier_names_missing_rank(rank, n, done_dir):
    import shoal.torch

    dist.init_process_group("shoal", rank=rank, world_size=n, timeout=timedelta(seconds=20))
    if rank == 1:  # never calls it; alive until the others are done
        for r in (0, 2):
            _wait_for_file(os.path.join(done_dir, str(r)), 10)
        return None
    try:
        shoal.torch.monitored_barrier(timeout=timedelta(seconds=1), wait_all_ranks=True)
    except RuntimeError as e:
        return str(e)
    finally:
        open(os.path.join(done_dir, str(rank)), "w").close()
    return None


def test_monitored_barrier_reports_missing_rank(tmp_path):
    res = spawn(f_monitored_barrier_names_missing_rank, 3, str(tmp_path), timeout=60)
    assert "Ranks 1 failed to pass monitoredBarrier" in res[0], res[0]  # gloo's words


# ---------------------------------------------------------------- torchrun

TORCHRUN_SCRIPT = textwrap.dedent(
    """
    import os, torch, torch.distributed as dist
    import shoal
    dist.init_process_group("shoal")   # env:// from torchrun
    r, n = dist.get_rank(), dist.get_world_size()
    assert int(os.environ["LOCAL_RANK"]) == r
    t = torch.full((1000,), float(r))
    dist.all_reduce(t)
    assert torch.all(t == n * (n - 1) / 2)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(16, 8)).pow(2).mean().backward()
        opt.step()
    w = torch.cat([p.detach().flatten() for p in model.parameters()])
    ws = [torch.empty_like(w) for _ in range(n)]
    dist.all_gather(ws, w)
    assert all(torch.equal(ws[0], x) for x in ws)
    dist.destroy_process_group()
    print("TORCHRUN-OK", r)
    """
)


def test_torchrun(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=3",
        f"--master-port={free_port()}",
        str(script),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("TORCHRUN-OK") == 3, p.stdout + p.stderr
