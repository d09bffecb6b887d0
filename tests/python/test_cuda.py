"""CUDA tensors on the shoal backend. shoal moves host memory: a CUDA tensor is copied to pinned
host memory before the op (on the caller's current stream, which is then synchronized) and back
when it completes (csrc/torch/backend.cpp, Builder). What that must give a user:

* the op sees everything queued on the current stream before the call, even work the GPU has
  not done yet when the host makes the call (a side stream with a long kernel);
* after ``wait()`` (or a blocking call) the result is in the tensor for any stream to read, and a
  Work's future holds CUDA tensors (DDP's comm hooks chain on it);
* ``cpu:gloo,cuda:shoal`` and ``device_id=`` in init_process_group work;
* a CPU tensor and a CUDA tensor in one op is a clear error.

Every test here needs a GPU and skips without one (CI has none). scripts/cuda_check.sh, on a GPU
machine, runs this file and then the pooled suites again on CUDA tensors
(``SHOAL_TEST_DEVICE=cuda``: every op, dtype and reduce op of test_collectives.py; DDP and FSDP2
of test_ddp_fsdp.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from harness import spawn

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# GPU cycles a stream sleeps before the data the op needs is written: the host reaches the op
# long before the GPU has written it (about 50 ms on a 2 GHz GPU).
SLEEP_CYCLES = 100_000_000


def gpu(rank):
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    return dev


def tri(n):
    return n * (n + 1) // 2


# ---------------------------------------------------------------- worker functions


def w_side_stream(rank, n):
    dev = gpu(rank)
    s = torch.cuda.Stream(device=dev)
    x = torch.zeros(1 << 20, device=dev)
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.fill_(rank + 1)  # still queued when the host calls all_reduce
        dist.all_reduce(x)
        y = x * 2  # queued on s after the op
    s.synchronize()
    assert torch.all(x == tri(n)).item(), x[:4]
    assert torch.all(y == 2 * tri(n)).item(), y[:4]
    # The same with async_op: wait(), then read the result on another stream (the default one).
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.fill_(rank + 2)
        w = dist.all_reduce(x, async_op=True)
    w.wait()
    assert torch.all(x == tri(n) + n).item(), x[:4]
    # Other ops read their inputs on the side stream too.
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLEEP_CYCLES)
        part = torch.full((5,), float(rank), device=dev)
        out = torch.empty(5 * n, device=dev)
        dist.all_gather_into_tensor(out, part)
    s.synchronize()
    assert torch.equal(out, torch.arange(n, device=dev).float().repeat_interleave(5))
    # Results that shoal only writes (broadcast to a non-root, all_gather's list, recv): kernels
    # queued before the op that write them, or read them, still run before the result lands.
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLEEP_CYCLES)
        b = torch.full((3,), float(rank), device=dev)  # a pending write
        before = b * 1  # a pending read
        dist.broadcast(b, src=n - 1)
        outs = [torch.empty(2, device=dev) for _ in range(n)]
        torch.cuda._sleep(SLEEP_CYCLES)
        for o in outs:
            o.fill_(-1.0)
        dist.all_gather(outs, torch.full((2,), float(rank), device=dev))
        got = torch.empty(4, device=dev)
        if n > 1:
            torch.cuda._sleep(SLEEP_CYCLES)
            got.fill_(-1.0)
            ops = [dist.P2POp(dist.isend, torch.full((4,), float(rank), device=dev), (rank + 1) % n),
                   dist.P2POp(dist.irecv, got, (rank - 1) % n)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
    s.synchronize()
    assert torch.all(before == rank).item(), before
    assert torch.all(b == n - 1).item(), b
    assert all(torch.all(o == r).item() for r, o in enumerate(outs)), outs
    if n > 1:
        assert torch.all(got == (rank - 1) % n).item(), got


def w_futures(rank, n):
    dev = gpu(rank)
    t = torch.full((1000,), float(rank + 1), device=dev)
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)  # as DDP's comm hooks chain
    (res,) = fut.wait()
    assert res.device == dev and res.data_ptr() == t.data_ptr()
    assert torch.all(doubled.wait() == 2 * tri(n)).item()
    assert torch.all(t == tri(n)).item()
    # get_future after completion; futures of other ops.
    w = dist.broadcast(torch.full((4,), float(rank), device=dev), src=0, async_op=True)
    w.wait()
    (b,) = w.get_future().wait()
    assert b.device == dev and torch.all(b == 0).item()
    outs = [torch.empty(2, device=dev) for _ in range(n)]
    got = dist.all_gather(outs, torch.full((2,), float(rank), device=dev), async_op=True).get_future().wait()
    assert all(g.device == dev and torch.all(g == r).item() for r, g in enumerate(got))


def w_large(rank, n):
    dev = gpu(rank)
    count = 16 << 20  # 64 MiB of float32: the chunked paths
    base = torch.arange(count, device=dev, dtype=torch.float32) % 1024
    t = base + rank
    dist.all_reduce(t)
    assert torch.equal(t, base * n + tri(n - 1))
    out = torch.empty(n * count, device=dev, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(out, torch.full((count,), float(rank), device=dev, dtype=torch.bfloat16))
    assert torch.equal(out.view(n, count).float().amin(1), torch.arange(n, device=dev).float())
    assert torch.equal(out.view(n, count).float().amax(1), torch.arange(n, device=dev).float())


def w_odd_sizes(rank, n):
    dev = gpu(rank)
    for count in (0, 1, 7, 4097, 100_003):
        t = torch.full((count,), float(rank + 1), device=dev, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        assert t.numel() == count and torch.all(t == n).item()
        outs = [torch.empty(count, device=dev, dtype=torch.int32) for _ in range(n)]
        dist.all_gather(outs, torch.full((count,), rank, device=dev, dtype=torch.int32))
        assert all(torch.all(o == r).item() for r, o in enumerate(outs))


def w_mixed_devices_refused(rank, n):
    dev = gpu(rank)
    for bad in (
        lambda: dist.all_gather_into_tensor(torch.empty(2 * n), torch.ones(2, device=dev)),
        lambda: dist.all_gather([torch.empty(2, device=dev) for _ in range(n - 1)] + [torch.empty(2)],
                                torch.ones(2, device=dev)),
        lambda: dist.reduce_scatter_tensor(torch.empty(2, device=dev), torch.ones(2 * n)),
    ):
        with pytest.raises((RuntimeError, ValueError), match="device"):
            bad()
    t = torch.ones(3, device=dev)  # the group still works
    dist.all_reduce(t)
    assert torch.all(t == n).item()


def w_ddp_device_ids(rank, n):
    import test_ddp_fsdp as m

    dev = gpu(rank)
    model = torch.nn.parallel.DistributedDataParallel(m.make_model().to(dev), device_ids=[dev],
                                                      gradient_as_bucket_view=True, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(4):
        x, y = (t.to(dev) for t in m.batch(rank, step))
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    ref = m.reference(n, 4)  # on the CPU: a reference computed apart from the GPU run
    for p, q in zip(model.parameters(), ref):
        torch.testing.assert_close(p.detach().cpu(), q, rtol=1e-4, atol=1e-5)


def f_init_forms(rank, n, store_file):
    """device_id= (eager init) and a backend per device: CPU tensors on gloo, CUDA ones on shoal."""
    import shoal.torch

    dev = gpu(rank)
    dist.init_process_group("shoal", rank=rank, world_size=n, device_id=dev)
    t = torch.full((4,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    assert torch.all(t == tri(n)).item()
    dist.destroy_process_group()

    dist.init_process_group("cpu:gloo,cuda:shoal", rank=rank, world_size=n, init_method=f"file://{store_file}")
    pg = dist.distributed_c10d._get_default_group()
    assert isinstance(pg._get_backend(torch.device("cuda")), shoal.torch.BackendShoal)
    assert not shoal.torch.is_shoal_group(pg)  # its CPU backend is gloo
    for device in (dev, torch.device("cpu")):
        t = torch.full((4,), float(rank + 1), device=device)
        dist.all_reduce(t)
        assert torch.all(t == tri(n)).item(), device
    dist.destroy_process_group()


# ---------------------------------------------------------------- tests


def test_side_stream(group):
    group.run(w_side_stream)


def test_futures(group):
    group.run(w_futures)


def test_large(group):
    group.run(w_large)


def test_odd_sizes(group):
    group.run(w_odd_sizes)


def test_mixed_devices_refused(group2):
    group2.run(w_mixed_devices_refused)


def test_ddp_device_ids(group):
    group.run(w_ddp_device_ids)


@pytest.mark.parametrize("n", [2, 3])
def test_init_forms(n, tmp_path):
    spawn(f_init_forms, n, str(tmp_path / "store"))
