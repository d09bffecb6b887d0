"""Every op of the shoal backend against a reference computed in each rank, at world sizes 1..4,
across dtypes and reduce ops, sync and async, contiguous or not."""

from __future__ import annotations

import datetime
import sys
import threading

import pytest
import torch
import torch.distributed as dist

from refs import DTYPES, MOVE_ONLY_DTYPES, OPS, assert_equal, data, reduce_ref, supported

ALL_DTYPES = DTYPES + MOVE_ONLY_DTYPES
dtype_id = lambda d: str(d).replace("torch.", "")  # noqa: E731

# ---------------------------------------------------------------- worker functions


def w_allreduce(rank, n, dtype, op, shape, async_op):
    t = data(rank, shape, dtype, seed=1)
    if not supported(dtype, op):
        try:
            dist.all_reduce(t, op=OPS[op])
        except RuntimeError as e:
            assert "shoal" in str(e), e
            return "raised"
        raise AssertionError(f"all_reduce({dtype}, {op}) should raise")
    expected = reduce_ref([data(r, shape, dtype, seed=1) for r in range(n)], op, dtype)
    if async_op:
        w = dist.all_reduce(t, op=OPS[op], async_op=True)
        fut = w.get_future()
        assert w.wait()
        assert w.is_completed() and w.is_success()
        (res,) = fut.wait()
        assert res.data_ptr() == t.data_ptr()
    else:
        assert dist.all_reduce(t, op=OPS[op]) is None
    assert_equal(t, expected, f"all_reduce {dtype} {op}")
    return "ok"


def w_allreduce_inline(rank, n):
    """shoal.torch.all_reduce_ against the reference, every dtype and op at sizes 0 to 4099, a
    float and an integer dtype at 1 Mi + 3 (the large path of the same C++ allreduce, whose every
    dtype the C++ matrix covers), a non-contiguous tensor (through dist.all_reduce), and its
    refusals."""
    import shoal.torch

    for dtype in DTYPES:
        for op in OPS:
            for i, shape in enumerate([(0,), (1,), (7,), (4099,), ((1 << 20) + 3,)]):
                if shape[0] > 4099 and (op not in ("SUM", "MAX") or dtype not in (torch.float32, torch.int32)):
                    continue
                t = data(rank, shape, dtype, seed=40 + i)
                if not supported(dtype, op):
                    try:
                        shoal.torch.all_reduce_(t, OPS[op])
                    except RuntimeError as e:
                        assert "shoal" in str(e), e
                        continue
                    raise AssertionError(f"all_reduce_({dtype}, {op}) should raise")
                assert shoal.torch.all_reduce_(t, OPS[op]) is t
                want = reduce_ref([data(r, shape, dtype, seed=40 + i) for r in range(n)], op, dtype)
                assert_equal(t, want, f"all_reduce_ {dtype} {op} {shape}")
    t = data(rank, (6, 5), torch.float32, seed=50).t()  # not contiguous
    shoal.torch.all_reduce_(t)
    assert_equal(t, reduce_ref([data(r, (6, 5), torch.float32, seed=50).t() for r in range(n)], "SUM", torch.float32),
                 "all_reduce_ of a transposed tensor")
    m = torch.tensor([float(rank), -float(rank)])  # a ReduceOp object, not torch's enum value
    shoal.torch.all_reduce_(m, dist.ReduceOp(dist.ReduceOp.MAX))
    assert m.tolist() == [n - 1.0, 0.0], m
    z = torch.full((4,), complex(rank, 1), dtype=torch.complex64)  # through dist.all_reduce
    shoal.torch.all_reduce_(z)
    assert torch.equal(z, torch.full((4,), complex(sum(range(n)), n), dtype=torch.complex64)), z
    gloo = dist.new_group(backend="gloo")
    try:
        shoal.torch.all_reduce_(torch.ones(3), group=gloo)
        raise AssertionError("all_reduce_ on a gloo group should raise")
    except ValueError as e:
        assert "not shoal" in str(e), e
    dist.destroy_process_group(gloo)


def w_broadcast(rank, n, dtype, root):
    shape = (3, 5)
    t = data(rank, shape, dtype, seed=2)
    dist.broadcast(t, src=root)
    assert_equal(t, data(root, shape, dtype, seed=2), f"broadcast {dtype} from {root}")


def w_reduce(rank, n, dtype, op, root):
    shape = (17,)
    t = data(rank, shape, dtype, seed=3)
    mine = t.clone()
    dist.reduce(t, dst=root, op=OPS[op])
    if rank == root:
        assert_equal(t, reduce_ref([data(r, shape, dtype, seed=3) for r in range(n)], op, dtype), "reduce")
    else:
        assert_equal(t, mine, "reduce leaves non-roots unchanged")


def w_all_gather(rank, n, dtype, uneven):
    size = lambda r: (r + 1 if uneven else 4)  # noqa: E731
    t = data(rank, (size(rank),), dtype, seed=4)
    outs = [torch.empty(size(r), dtype=dtype) for r in range(n)]
    versions = [o._version for o in outs]
    dist.all_gather(outs, t)
    for r in range(n):
        assert_equal(outs[r], data(r, (size(r),), dtype, seed=4), f"all_gather block {r}")
    # Written in place as by copy_: autograd sees each output's version move.
    assert all(o._version > v for o, v in zip(outs, versions)), [(o._version, v) for o, v in zip(outs, versions)]
    # Blocks on either side of the size the backend copies as bytes (below ATen's grain size,
    # 32768 elements), and a strided output.
    size = lambda r: 40000 if r == 0 else 3 + r  # noqa: E731
    t = data(rank, (size(rank),), dtype, seed=5)
    outs = [torch.empty(size(r), dtype=dtype) for r in range(n)]
    outs[-1] = torch.empty(size(n - 1) * 2, dtype=dtype)[::2]
    dist.all_gather(outs, t)
    for r in range(n):
        assert_equal(outs[r], data(r, (size(r),), dtype, seed=5), f"all_gather block {r} of {size(r)}")


def w_all_gather_into_tensor(rank, n, dtype, in_place):
    k = 6
    out = torch.empty(n * k, dtype=dtype)
    if in_place:  # the input is this rank's block of the output (how FSDP calls it)
        inp = out.narrow(0, rank * k, k)
        inp.copy_(data(rank, (k,), dtype, seed=5))
    else:
        inp = data(rank, (k,), dtype, seed=5)
    dist.all_gather_into_tensor(out, inp)
    assert_equal(out, torch.cat([data(r, (k,), dtype, seed=5) for r in range(n)]), "all_gather_into_tensor")
    out2 = torch.empty(n, k, dtype=dtype)  # stacked form
    dist.all_gather_into_tensor(out2, data(rank, (k,), dtype, seed=5))
    assert_equal(out2, torch.stack([data(r, (k,), dtype, seed=5) for r in range(n)]), "all_gather_into_tensor 2d")


def w_gather_scatter(rank, n, dtype, root):
    shape = (2, 3)
    t = data(rank, shape, dtype, seed=6)
    outs = [torch.empty(shape, dtype=dtype) for _ in range(n)] if rank == root else None
    dist.gather(t, gather_list=outs, dst=root)
    if rank == root:
        for r in range(n):
            assert_equal(outs[r], data(r, shape, dtype, seed=6), f"gather block {r}")
    out = torch.empty(shape, dtype=dtype)
    ins = [data(100 + r, shape, dtype, seed=7) for r in range(n)] if rank == root else None
    dist.scatter(out, scatter_list=ins, src=root)
    assert_equal(out, data(100 + rank, shape, dtype, seed=7), "scatter")


def w_reduce_scatter(rank, n, dtype, op):
    k = 5
    ins = [data(rank * 10 + j, (k,), dtype, seed=8) for j in range(n)]
    out = torch.empty(k, dtype=dtype)
    dist.reduce_scatter(out, ins, op=OPS[op])
    expected = reduce_ref([data(r * 10 + rank, (k,), dtype, seed=8) for r in range(n)], op, dtype)
    assert_equal(out, expected, "reduce_scatter")
    flat = torch.cat(ins)
    out2 = torch.empty(k, dtype=dtype)
    dist.reduce_scatter_tensor(out2, flat, op=OPS[op])
    assert_equal(out2, expected, "reduce_scatter_tensor")


def w_all_to_all(rank, n, dtype):
    # Uneven: rank r sends (r + j + 1) elements to rank j.
    ins = [data(rank * 10 + j, (rank + j + 1,), dtype, seed=9) for j in range(n)]
    outs = [torch.empty(r + rank + 1, dtype=dtype) for r in range(n)]
    dist.all_to_all(outs, ins)
    for r in range(n):
        assert_equal(outs[r], data(r * 10 + rank, (r + rank + 1,), dtype, seed=9), f"all_to_all from {r}")
    # One block past the size the backend copies as bytes, each way.
    size = lambda src, dst: 33000 if src == dst == 0 else src + dst + 1  # noqa: E731
    ins = [data(rank * 10 + j, (size(rank, j),), dtype, seed=10) for j in range(n)]
    outs = [torch.empty(size(r, rank), dtype=dtype) for r in range(n)]
    dist.all_to_all(outs, ins)
    for r in range(n):
        assert_equal(outs[r], data(r * 10 + rank, (size(r, rank),), dtype, seed=10), f"all_to_all from {r}")


def w_all_to_all_single(rank, n, dtype, uneven):
    cols = 3
    if uneven:
        in_splits = [rank + j + 1 for j in range(n)]
        out_splits = [r + rank + 1 for r in range(n)]
    else:
        in_splits = out_splits = [2] * n
    blocks = [data(rank * 10 + j, (in_splits[j], cols), dtype, seed=10) for j in range(n)]
    inp = torch.cat(blocks)
    out = torch.empty(sum(out_splits), cols, dtype=dtype)
    if uneven:
        dist.all_to_all_single(out, inp, out_splits, in_splits)
    else:
        dist.all_to_all_single(out, inp)
    expected = torch.cat([data(r * 10 + rank, (out_splits[r], cols), dtype, seed=10) for r in range(n)])
    assert_equal(out, expected, "all_to_all_single")


def w_send_recv(rank, n, dtype):
    right, left = (rank + 1) % n, (rank - 1) % n
    shape = (4, 4)
    # isend/irecv ring, then blocking send/recv pairs with tags, then batch_isend_irecv.
    got = torch.empty(shape, dtype=dtype)
    reqs = [dist.isend(data(rank, shape, dtype, seed=11), right), dist.irecv(got, left)]
    for r in reqs:
        r.wait()
    assert_equal(got, data(left, shape, dtype, seed=11), "isend/irecv")
    if rank % 2 == 0:
        dist.send(data(rank, shape, dtype, seed=12), right, tag=7)
        dist.recv(got, left, tag=7)
    else:
        dist.recv(got, left, tag=7)
        dist.send(data(rank, shape, dtype, seed=12), right, tag=7)
    assert_equal(got, data(left, shape, dtype, seed=12), "send/recv")
    got2 = torch.empty(shape, dtype=dtype)
    ops = [dist.P2POp(dist.isend, data(rank, shape, dtype, seed=13), right), dist.P2POp(dist.irecv, got2, left)]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    assert_equal(got2, data(left, shape, dtype, seed=13), "batch_isend_irecv")


def w_recv_source_rank(rank, n):
    if rank == 0:
        t = torch.zeros(3)
        w = dist.irecv(t, src=1)
        w.wait()
        assert w._source_rank() == 1
        assert t.tolist() == [1.0, 2.0, 3.0]
    elif rank == 1:
        dist.send(torch.tensor([1.0, 2.0, 3.0]), 0)


def w_recv_anysource(rank, n):
    # Rank 0 receives one message from every other rank without naming the source.
    if rank == 0:
        seen = []
        for _ in range(n - 1):
            t = torch.zeros(3)
            src = dist.recv(t)
            assert t.tolist() == [float(src)] * 3, (src, t)
            seen.append(src)
        assert sorted(seen) == list(range(1, n)), seen
        w = dist.irecv(t := torch.zeros(3))  # irecv without src: Work._source_rank() after wait
        dist.send(torch.zeros(1), 1, tag=5)  # only now may rank 1 send its second message
        w.wait()
        assert w._source_rank() == 1 and t.tolist() == [7.0] * 3
    else:
        dist.send(torch.full((3,), float(rank)), 0)
        if rank == 1:
            dist.recv(torch.zeros(1), 0, tag=5)
            dist.send(torch.full((3,), 7.0), 0)


def w_sizes(rank, n, count):
    t = torch.full((count,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.all(t == n * (n + 1) / 2), t[:8]
    b = torch.full((count,), float(rank))
    dist.broadcast(b, src=n - 1)
    assert torch.all(b == n - 1)
    out = torch.empty(n * count)
    dist.all_gather_into_tensor(out, torch.full((count,), float(rank)))
    assert torch.equal(out, torch.arange(n).float().repeat_interleave(count))


def w_barrier(rank, n):
    for _ in range(3):
        dist.barrier()
    w = dist.barrier(async_op=True)
    w.wait()
    # dist.monitored_barrier() refuses every backend but gloo in Python; the C++ backend
    # implements it, reachable through the process group (and shoal.torch.monitored_barrier).
    import shoal.torch

    pg = dist.distributed_c10d._get_default_group()
    pg.monitored_barrier(datetime.timedelta(seconds=30))
    pg.monitored_barrier(datetime.timedelta(seconds=30), wait_all_ranks=True)
    shoal.torch.monitored_barrier(timeout=datetime.timedelta(seconds=30))


def w_coalesced(rank, n):
    ts = [data(rank, (k,), torch.float32, seed=14 + k) for k in (1, 5, 9)]
    exp = [reduce_ref([data(r, (k,), torch.float32, seed=14 + k) for r in range(n)], "SUM", torch.float32) for k in (1, 5, 9)]
    dist.all_reduce_coalesced(ts)
    for t, e in zip(ts, exp):
        assert_equal(t, e, "all_reduce_coalesced")
    # The coalescing manager: all_reduce, all_gather_into_tensor, reduce_scatter_tensor batches.
    from torch.distributed.distributed_c10d import _coalescing_manager

    ts = [data(rank, (k,), torch.float32, seed=14 + k) for k in (1, 5, 9)]
    with _coalescing_manager(async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    for t, e in zip(ts, exp):
        assert_equal(t, e, "coalesced all_reduce")
    outs = [torch.empty(n * 3) for _ in range(2)]
    with _coalescing_manager():
        for i, o in enumerate(outs):
            dist.all_gather_into_tensor(o, torch.full((3,), float(rank + i)))
    for i, o in enumerate(outs):
        assert torch.equal(o, (torch.arange(n).float() + i).repeat_interleave(3))
    rs = [torch.empty(2) for _ in range(2)]
    with _coalescing_manager():
        for i, o in enumerate(rs):
            dist.reduce_scatter_tensor(o, torch.full((2 * n,), float(i + 1)))
    for i, o in enumerate(rs):
        assert torch.equal(o, torch.full((2,), float(n * (i + 1))))
    # all_gather_coalesced (deprecated API, still used).
    outs = [[torch.empty(2), torch.empty(3)] for _ in range(n)]
    dist.all_gather_coalesced(outs, [torch.full((2,), float(rank)), torch.full((3,), float(-rank))])
    for r in range(n):
        assert outs[r][0].tolist() == [float(r)] * 2 and outs[r][1].tolist() == [float(-r)] * 3


def w_async_future(rank, n):
    t = torch.ones(1000) * (rank + 1)
    works = [dist.all_reduce(t.clone(), async_op=True) for _ in range(4)]
    futs = [w.get_future() for w in works]
    chained = futs[0].then(lambda f: f.value()[0] * 2)
    for w in works:
        w.wait()
    for f in futs:
        assert torch.all(f.wait()[0] == n * (n + 1) / 2)
    assert torch.all(chained.wait() == n * (n + 1))
    # get_future after completion; result().
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    assert torch.all(w.get_future().wait()[0] == n * (n + 1) / 2)
    assert w.result()[0].data_ptr() == t.data_ptr()
    # Futures of other ops.
    outs = [torch.empty(2) for _ in range(n)]
    w = dist.all_gather(outs, torch.full((2,), float(rank)), async_op=True)
    got = w.get_future().wait()
    assert len(got) == n and all(torch.equal(got[r], torch.full((2,), float(r))) for r in range(n))
    w = dist.broadcast(torch.zeros(2), 0, async_op=True)
    w.get_future().wait()
    w = dist.barrier(async_op=True)
    w.get_future().wait()
    # torch.futures.wait_all and collect_all
    ws = [dist.all_reduce(torch.ones(3), async_op=True) for _ in range(3)]
    res = torch.futures.wait_all([w.get_future() for w in ws])
    assert all(torch.all(r[0] == n) for r in res)


def w_waited_at_once(rank, n):
    """A collective whose caller waits at once (asyncOp False, as dist.all_reduce sets it) runs
    before the backend's call returns: its Work is complete then, copy-backs included; an async op
    queued before it completes first."""
    pg = dist.distributed_c10d._get_default_group()

    def waited(o, **fields):
        o.asyncOp = False
        for k, v in fields.items():
            setattr(o, k, v)
        return o

    total = float(n * (n + 1) // 2)
    t = torch.full((5,), float(rank + 1))
    w = pg.allreduce([t], waited(dist.AllreduceOptions()))
    assert w.is_completed() and w.is_success()
    assert torch.equal(t, torch.full((5,), total)), t
    assert w.wait() and w.result()[0].data_ptr() == t.data_ptr()
    # Staged (not contiguous): copied back before the call returns.
    v = (torch.arange(12.0).reshape(3, 4) * (rank + 1)).t()
    w = pg.allreduce([v], waited(dist.AllreduceOptions()))
    assert w.is_completed() and torch.equal(v, (torch.arange(12.0).reshape(3, 4) * total).t()), v
    b = torch.full((3,), float(rank))
    w = pg.broadcast([b], waited(dist.BroadcastOptions(), rootRank=n - 1))
    assert w.is_completed() and torch.equal(b, torch.full((3,), float(n - 1))), b
    outs = [torch.empty(2) for _ in range(n)]
    w = pg.allgather([outs], [torch.full((2,), float(rank))], waited(dist.distributed_c10d.AllgatherOptions()))
    assert w.is_completed() and all(torch.equal(outs[r], torch.full((2,), float(r))) for r in range(n)), outs
    assert pg.barrier(waited(dist.BarrierOptions())).is_completed()
    # An async op submitted first runs first.
    a = torch.ones(4)
    wa = dist.all_reduce(a, async_op=True)
    c = torch.full((4,), 2.0)
    dist.all_reduce(c)
    assert wa.wait() and torch.equal(a, torch.full((4,), float(n))), a
    assert torch.equal(c, torch.full((4,), 2.0 * n)), c


def w_chunks_of_one_buffer(rank, n, dtype):
    """List ops on the chunks of one flat buffer (`list(flat.chunk(n))`, ZeRO's partitions): the
    backend reads and writes them in place; in place (the input a chunk of the output, the output
    a chunk of the input), chunks in another order, and sizes on both sides of ATen's grain size."""
    for k in (3, 40000):
        blocks = [data(r, (k,), dtype, seed=20) for r in range(n)]
        # all_gather into chunks, then in place (the input is this rank's chunk).
        flat = torch.empty(n * k, dtype=dtype)
        chunks = list(flat.chunk(n))
        versions = [c._version for c in chunks]
        dist.all_gather(chunks, blocks[rank])
        assert_equal(flat, torch.cat(blocks), f"all_gather into chunks, {k}")
        assert all(c._version > v for c, v in zip(chunks, versions))
        flat = torch.zeros(n * k, dtype=dtype)
        chunks = list(flat.chunk(n))
        chunks[rank].copy_(blocks[rank])
        dist.all_gather(chunks, chunks[rank])
        assert_equal(flat, torch.cat(blocks), f"all_gather in place, {k}")
        # Chunks in reverse order: back to back, but not in rank order.
        flat = torch.empty(n * k, dtype=dtype)
        chunks = list(flat.chunk(n))[::-1]
        dist.all_gather(chunks, blocks[rank])
        assert_equal(flat, torch.cat(blocks[::-1]), f"all_gather into reversed chunks, {k}")
        # An empty block first (rank 0 gives none): it takes no room.
        if n > 1:
            flat = torch.empty((n - 1) * k, dtype=dtype)
            outs = [flat[:0]] + list(flat.chunk(n - 1))
            dist.all_gather(outs, blocks[rank] if rank else torch.empty(0, dtype=dtype))
            assert_equal(flat, torch.cat(blocks[1:]), f"all_gather after an empty block, {k}")
        # The same chunk listed twice: not back to back (the gather's blocks land in order).
        if n == 2:
            same = torch.empty(k, dtype=dtype)
            dist.all_gather([same, same], blocks[rank])
            assert_equal(same, blocks[1], f"all_gather into one chunk twice, {k}")
        # all_to_all between chunked buffers; block j of rank r's input goes to rank j.
        send = torch.cat([data(rank * 10 + j, (k,), dtype, seed=21) for j in range(n)])
        recv = torch.empty(n * k, dtype=dtype)
        dist.all_to_all(list(recv.chunk(n)), list(send.chunk(n)))
        assert_equal(recv, torch.cat([data(r * 10 + rank, (k,), dtype, seed=21) for r in range(n)]),
                     f"all_to_all between chunks, {k}")
        # ... in place: the same chunks in and out.
        dist.all_to_all(list(send.chunk(n)), list(send.chunk(n)))
        assert_equal(send, torch.cat([data(r * 10 + rank, (k,), dtype, seed=21) for r in range(n)]),
                     f"all_to_all in place, {k}")
        # gather and scatter at root 0 through chunks.
        if rank == 0:
            flat = torch.empty(n * k, dtype=dtype)
            dist.gather(blocks[rank], gather_list=list(flat.chunk(n)), dst=0)
            assert_equal(flat, torch.cat(blocks), f"gather into chunks, {k}")
            flat = torch.zeros(n * k, dtype=dtype)
            chunks = list(flat.chunk(n))
            chunks[0].copy_(blocks[0])
            dist.gather(chunks[0], gather_list=chunks, dst=0)  # in place: the input is a chunk
            assert_equal(flat, torch.cat(blocks), f"gather in place, {k}")
        else:
            dist.gather(blocks[rank], dst=0)
            dist.gather(blocks[rank], dst=0)
        src = torch.cat([data(100 + r, (k,), dtype, seed=22) for r in range(n)])
        out = torch.empty(k, dtype=dtype)
        dist.scatter(out, scatter_list=list(src.chunk(n)) if rank == 0 else None, src=0)
        assert_equal(out, data(100 + rank, (k,), dtype, seed=22), f"scatter from chunks, {k}")
        chunks = list(src.chunk(n))
        out = chunks[0] if rank == 0 else torch.empty(k, dtype=dtype)
        dist.scatter(out, scatter_list=chunks if rank == 0 else None, src=0)  # the root's out is a chunk
        assert_equal(out, data(100 + rank, (k,), dtype, seed=22), f"scatter in place, {k}")
        if dtype in DTYPES and supported(dtype, "SUM"):
            # reduce_scatter from chunks, then in place (the output is this rank's chunk).
            ins = torch.cat([data(rank * 10 + j, (k,), dtype, seed=23) for j in range(n)])
            expected = reduce_ref([data(r * 10 + rank, (k,), dtype, seed=23) for r in range(n)], "SUM", dtype)
            out = torch.empty(k, dtype=dtype)
            dist.reduce_scatter(out, list(ins.chunk(n)))
            assert_equal(out, expected, f"reduce_scatter from chunks, {k}")
            chunks = list(ins.chunk(n))
            dist.reduce_scatter(chunks[rank], chunks)
            assert_equal(chunks[rank], expected, f"reduce_scatter in place, {k}")
            # all_reduce_coalesced of a bucket's views.
            bucket = data(rank, (3 * k,), dtype, seed=24)
            views = [bucket[:k], bucket[k:2 * k].view(1, k), bucket[2 * k:]]
            want = reduce_ref([data(r, (3 * k,), dtype, seed=24) for r in range(n)], "SUM", dtype)
            dist.all_reduce_coalesced(views)
            assert_equal(bucket, want, f"all_reduce_coalesced of views, {k}")


def w_noncontiguous(rank, n):
    base = data(rank, (6, 8), torch.float32, seed=15)
    t = base.t()  # transposed view: not contiguous
    assert not t.is_contiguous()
    dist.all_reduce(t)
    exp = reduce_ref([data(r, (6, 8), torch.float32, seed=15) for r in range(n)], "SUM", torch.float32)
    assert_equal(base, exp, "all_reduce on a transposed view writes through")
    s = torch.zeros(10)[::2]  # strided
    if rank == 0:
        s.copy_(torch.arange(5.0))
    dist.broadcast(s, 0)
    assert s.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    outs = [torch.zeros(4, 2).t() for _ in range(n)]
    dist.all_gather(outs, torch.full((4, 2), float(rank)).t())
    for r in range(n):
        assert torch.all(outs[r] == r)
    big = torch.zeros(n * 2, 3)
    out = big[:, 1]  # a column: stride 3
    dist.all_gather_into_tensor(out, torch.full((2,), float(rank)))
    assert torch.equal(big[:, 1], torch.arange(n).float().repeat_interleave(2))
    assert torch.all(big[:, 0] == 0) and torch.all(big[:, 2] == 0)
    cl = torch.ones(1, 3, 4, 4).contiguous(memory_format=torch.channels_last) * (rank + 1)
    dist.all_reduce(cl)
    assert torch.all(cl == n * (n + 1) / 2) and cl.is_contiguous(memory_format=torch.channels_last)
    # reduce_scatter_tensor into a strided output
    rs = torch.zeros(4)[::2]
    dist.reduce_scatter_tensor(rs, torch.ones(2 * n))
    assert rs.tolist() == [float(n)] * 2


def w_thread_calls_while_another_runs_python(rank, n):
    """Collectives called from one Python thread while another runs Python. torch's binding lets
    go of the GIL before it calls the backend, which releases the GIL around a wait only where its
    own thread holds it: before Python 3.12 the current thread state is one for the process (that
    of whichever thread holds the GIL), and taking it for this thread's let another thread run
    Python without its state (a SIGSEGV in PyErr_Occurred)."""
    errors = []
    done = threading.Event()

    def calls():
        try:
            # Not contiguous: the backend stages it (a copy of about a millisecond) before it looks
            # at the GIL, so the main thread has taken the GIL by then, every time.
            t = torch.empty(1 << 18, 2)[:, 0]
            for i in range(10):
                t.fill_(rank + i)
                dist.all_reduce(t)  # waited for at once: the op runs in the call
                assert torch.all(t == n * i + n * (n - 1) // 2), (i, t[:4])
        except BaseException as e:  # noqa: BLE001  (reported below, on the main thread)
            errors.append(e)
        finally:
            done.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # the GIL changes hands often: the test is quick, the race frequent
    try:
        th = threading.Thread(target=calls)
        th.start()
        spins = 0
        while not done.is_set():
            spins += 1  # Python on this thread, holding the GIL between switches
        th.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors
    assert spins > 0


def w_views_with_bits(rank, n):
    """Tensors whose bytes are not their values, given to the backend itself as the Ray group and
    shoal.torch.all_reduce_ give them (torch.distributed refuses conjugate and negative views before
    a backend sees them): each op must see the values. On the CPU only: other devices' tensors
    are staged whatever their views."""
    be = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    z = [torch.complex(data(r, (5,), torch.float32, seed=16), data(r, (5,), torch.float32, seed=17)) for r in range(n)]
    src = z[0].conj() if rank == 0 else torch.zeros_like(z[0])
    be.broadcast([src]).wait()
    assert_equal(src, z[0].conj().resolve_conj(), "broadcast from a conjugate view")
    dst = z[0].clone() if rank == 0 else torch.zeros_like(z[0]).conj()
    be.broadcast([dst]).wait()
    assert_equal(dst.resolve_conj(), z[0], "broadcast into a conjugate view")
    out = torch.zeros(n * 5, dtype=torch.complex64)
    be._allgather_base(out, z[rank].conj()).wait()
    assert_equal(out, torch.cat([t.conj().resolve_conj() for t in z]), "all_gather_into_tensor of conjugate views")

    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    expected = torch.stack([-data(r, (7,), torch.float32, seed=18) for r in range(n)]).amax(0)
    neg = torch._neg_view(data(rank, (7,), torch.float32, seed=18))
    be.allreduce([neg], opts).wait()
    assert_equal(neg.resolve_neg(), expected, "all_reduce MAX of negative views")
    neg = torch._neg_view(data(rank, (7,), torch.float32, seed=18))
    assert not be.allreduce_inline(neg, dist.ReduceOp(dist.ReduceOp.MAX)), "the blocking call leaves a view to the backend"
    be.allreduce([neg], opts).wait()  # as the Ray group goes on
    assert_equal(neg.resolve_neg(), expected, "all_reduce MAX of negative views, after the blocking call's refusal")

    zero = torch._efficientzerotensor(5)
    got = zero if rank == 0 else torch.ones(5)
    be.broadcast([got]).wait()
    assert torch.equal(got, torch.zeros(5)), "broadcast from a zero tensor"
    with pytest.raises(RuntimeError, match="zero tensor"):
        be.allreduce([torch._efficientzerotensor(3)], opts)
    t = torch.full((3,), float(rank))
    be.allreduce([t], opts).wait()
    assert t.tolist() == [float(n - 1)] * 3, "the group after a refused output"


def w_empty(rank, n):
    t = torch.empty(0)
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    out = torch.empty(0)
    dist.all_gather_into_tensor(out, torch.empty(0))
    outs = [torch.empty(0) for _ in range(n)]
    dist.all_gather(outs, torch.empty(0))


def w_scalar(rank, n):
    t = torch.tensor(float(rank))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    assert t.item() == n - 1
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": r} for r in range(n)]
    lst = [rank * 10, "x"] if rank == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    assert lst == [0, "x"]


def w_errors(rank, n):
    t = torch.ones(3, dtype=torch.int16)
    for bad in (
        lambda: dist.all_reduce(t),  # dtype shoal cannot reduce
        lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND),  # bitwise on float
        lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool), op=dist.ReduceOp.AVG),
        lambda: dist.all_reduce(torch.ones(3), op=dist._make_nccl_premul_sum(2.0)),
        lambda: dist.reduce_scatter(torch.empty(2), [torch.ones(2 + r) for r in range(n)]),
    ):
        try:
            bad()
        except (RuntimeError, ValueError) as e:
            assert "shoal" in str(e) or n == 1, e
        else:
            if n > 1:
                raise AssertionError("should raise")
    # The group still works.
    x = torch.ones(2)
    dist.all_reduce(x)
    assert x.tolist() == [float(n)] * 2


def w_get_backend(rank, n):
    import shoal.torch

    assert dist.get_backend() == "shoal"
    assert shoal.torch.is_shoal_group()
    be = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    tr = be.transports()
    assert tr[rank] == "self" and all(x in ("shm", "tcp") for i, x in enumerate(tr) if i != rank), tr
    return tr


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_all_reduce(group, dtype, op):
    group.run(w_allreduce, dtype, op, (3, 343), False)


def test_all_reduce_inline(group):
    group.run(w_allreduce_inline)


@pytest.mark.parametrize("op", ["SUM", "MAX"])
def test_all_reduce_async(group, op):
    group.run(w_allreduce, torch.float32, op, (1000,), True)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_broadcast(group, dtype):
    for root in range(group.world_size):
        group.run(w_broadcast, dtype, root)


@pytest.mark.parametrize("op", ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "BXOR"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bfloat16], ids=dtype_id)
def test_reduce(group, dtype, op):
    if not supported(dtype, op):
        pytest.skip("not defined for this dtype")
    for root in range(group.world_size):
        group.run(w_reduce, dtype, op, root)


@pytest.mark.parametrize("uneven", [False, True], ids=["even", "uneven"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_all_gather(group, dtype, uneven):
    group.run(w_all_gather, dtype, uneven)


@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.complex64], ids=dtype_id)
def test_all_gather_into_tensor(group, dtype, in_place):
    group.run(w_all_gather_into_tensor, dtype, in_place)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8, torch.bool, torch.int16], ids=dtype_id)
def test_gather_scatter(group, dtype):
    for root in range(group.world_size):
        group.run(w_gather_scatter, dtype, root)


@pytest.mark.parametrize("op", ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "BOR"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.uint8], ids=dtype_id)
def test_reduce_scatter(group, dtype, op):
    if not supported(dtype, op):
        pytest.skip("not defined for this dtype")
    group.run(w_reduce_scatter, dtype, op)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.complex64], ids=dtype_id)
def test_all_to_all(group, dtype):
    group.run(w_all_to_all, dtype)


@pytest.mark.parametrize("uneven", [False, True], ids=["even", "uneven"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int16], ids=dtype_id)
def test_all_to_all_single(group, dtype, uneven):
    group.run(w_all_to_all_single, dtype, uneven)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.complex64], ids=dtype_id)
def test_send_recv(group2, dtype):
    group2.run(w_send_recv, dtype)


def test_recv_source_rank(group2):
    group2.run(w_recv_source_rank)


def test_recv_anysource(group2):
    group2.run(w_recv_anysource)


@pytest.mark.parametrize("count", [1, 7, 4096, 100_003, 1 << 20])
def test_sizes(group, count):
    group.run(w_sizes, count)


def test_barrier(group):
    group.run(w_barrier)


def test_coalesced(group):
    group.run(w_coalesced)


def test_async_and_futures(group):
    group.run(w_async_future)


def test_waited_at_once(group):
    group.run(w_waited_at_once)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8, torch.bfloat16], ids=dtype_id)
def test_chunks_of_one_buffer(group, dtype):
    group.run(w_chunks_of_one_buffer, dtype)


def test_noncontiguous(group):
    group.run(w_noncontiguous)


def test_thread_calls_while_another_runs_python(group):
    group.run(w_thread_calls_while_another_runs_python)


def test_views_with_bits(group):
    group.run(w_views_with_bits)


def test_empty_tensors(group):
    group.run(w_empty)


def test_scalars_and_objects(group):
    group.run(w_scalar)


def test_errors_leave_the_group_usable(group):
    group.run(w_errors)


def test_backend_identity(group):
    group.run(w_get_backend)
