"""shoal in Ray with CUDA tensors, on real GPUs: the direct transport passes CUDA tensors between
actors that share a GPU, the collective backend reduces CUDA tensors, and a WorkerGroup whose
workers ask for a GPU gets it as its torch device and runs DDP on it.

Needs a GPU and Ray; skips without either (CI has no GPU). It starts its own Ray, with the GPUs
torch sees, so it skips when another test's Ray is already up: scripts/cuda_check.sh runs it on
its own. The CPU paths of the same APIs are tested in test_ray_transport.py,
test_ray_collective.py and test_ray_worker_group.py."""

from __future__ import annotations

import sys

import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
import shoal  # noqa: E402,F401  registers the collective backend and the transport

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

GPU_SHARE = 0.25  # the two peers and a WorkerGroup of two on one GPU


@pytest.fixture(scope="module")
def ray_gpu():
    if ray.is_initialized():
        pytest.skip("another test's Ray (logical GPUs) is up: run this file on its own")
    ray.init(num_cpus=8, num_gpus=torch.cuda.device_count(), include_dashboard=False, logging_level="warning")
    yield
    ray.shutdown()


def make(seed, shape=(257, 33), dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


@ray.remote(num_gpus=GPU_SHARE, num_cpus=1)
class GpuPeer:
    def __init__(self):
        import shoal  # noqa: F401

        self.kept = None

    def device(self) -> str:
        return str(torch.cuda.current_device()) + ":" + torch.cuda.get_device_name()

    @ray.method(tensor_transport="shoal")
    def give(self, seed):
        return {"a": make(seed).cuda(), "b": [make(seed + 1, (5,), torch.bfloat16).cuda(), make(seed + 2, (0,)).cuda()]}

    @ray.method(tensor_transport="shoal")
    def give_kept(self, seed):
        self.kept = make(seed).cuda()
        return self.kept

    def is_kept(self, t) -> bool:
        return t.data_ptr() == self.kept.data_ptr()

    def check(self, got, seed) -> str:
        """What the consumer received, compared on the CPU with the values rebuilt from the seed."""
        want = {"a": make(seed), "b": [make(seed + 1, (5,), torch.bfloat16), make(seed + 2, (0,))]}
        for g, w in ((got["a"], want["a"]), (got["b"][0], want["b"][0]), (got["b"][1], want["b"][1])):
            if g.device.type != "cuda":
                return f"on {g.device}"
            if not torch.equal(g.cpu(), w):
                return "values differ"
        return "ok"

    def allreduce(self, rank, group) -> list:
        from ray.util import collective as col

        t = torch.full((1000,), float(rank + 1), device="cuda")
        col.allreduce(t, group_name=group)
        b = torch.full((7,), float(rank), device="cuda")
        col.broadcast(b, src_rank=1, group_name=group)
        return [t.device.type, t[:3].tolist(), b.tolist()]


@pytest.fixture(scope="module")
def peers(ray_gpu):
    from ray.experimental.collective import create_collective_group, destroy_collective_group

    a, b = GpuPeer.remote(), GpuPeer.remote()
    create_collective_group([a, b], backend="shoal", name="gpu rdt")
    yield a, b
    destroy_collective_group("gpu rdt")
    for x in (a, b):
        ray.kill(x)


def test_direct_transport_cuda_tensors(peers):
    a, b = peers
    for seed in (1, 2, 3):
        assert ray.get(b.check.remote(a.give.remote(seed), seed), timeout=120) == "ok"
        assert ray.get(a.check.remote(b.give.remote(seed + 10), seed + 10), timeout=120) == "ok"
    # A ref passed back to its producer gives the very tensor (no copy).
    ref = a.give_kept.remote(7)
    assert ray.get(a.is_kept.remote(ref), timeout=120)


def test_collective_backend_cuda_tensors(peers):
    from ray.util import collective as col

    col.create_collective_group(list(peers), 2, [0, 1], backend="shoal", group_name="gpu col")
    out = ray.get([x.allreduce.remote(r, "gpu col") for r, x in enumerate(peers)], timeout=120)
    for dev, head, b in out:
        assert dev == "cuda" and head == [3.0] * 3 and b == [1.0] * 7


def _ddp_on_gpu():
    import torch.distributed as dist
    import torch.nn as nn

    from shoal.ray.worker_group import get_context

    dev = torch.device(get_context().device)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2).to(dev))
    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(4, 8, generator=g).to(dev)
    model(x).sum().backward()
    grads = [p.grad.detach().cpu() for p in model.parameters()]
    return str(dev), dist.get_backend(), [gr.tolist() for gr in grads], x.cpu().tolist()


def test_worker_group_on_gpus(ray_gpu):
    from shoal.ray import WorkerGroup

    g = WorkerGroup(2, resources_per_worker={"GPU": GPU_SHARE, "CPU": 1})
    try:
        out = g.execute(_ddp_on_gpu)
    finally:
        g.shutdown()
    devs = {o[0] for o in out}
    assert devs == {"cuda:0"}, devs
    assert all(o[1] == "shoal" for o in out)
    # DDP averaged the gradients: equal on both workers, and equal to the mean of each worker's own
    # gradient computed here on the CPU from its inputs.
    torch.manual_seed(0)
    w = torch.nn.Linear(8, 2)
    own = []
    for o in out:
        w.zero_grad()
        w(torch.tensor(o[3])).sum().backward()
        own.append([p.grad.clone() for p in w.parameters()])
    for i in range(2):
        want = (own[0][i] + own[1][i]) / 2
        for o in out:
            torch.testing.assert_close(torch.tensor(o[2][i]), want, rtol=1e-5, atol=1e-5)
