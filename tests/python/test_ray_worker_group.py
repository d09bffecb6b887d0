"""shoal.ray.WorkerGroup: ranks and environment, collectives on shoal and gloo, CUDA_VISIBLE_DEVICES
shared among the workers of a node (logical GPUs of the test cluster), a clear error for an unknown
backend, and failures -- a worker that raises or dies -- that raise in the driver and tear the
whole group down without hanging."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from shoal.ray import WorkerGroup  # noqa: E402
from shoal.ray.worker_group import WorkerGroupError  # noqa: E402

# The workers cannot import this test module: ship its functions by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 3


@pytest.fixture(scope="module")
def wg(ray_local):
    g = WorkerGroup(N)  # backend "shoal", one CPU each
    yield g
    g.shutdown()
    assert g.is_shut_down


def _whoami():
    import torch.distributed as dist

    import shoal.torch
    from shoal.ray.worker_group import get_context

    c = get_context()
    env = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")}
    return {
        "rank": dist.get_rank(),
        "size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "shoal": shoal.torch.is_shoal_group(),
        "ctx": (c.world_rank, c.world_size, c.local_rank, c.local_world_size, c.node_rank),
        "env": env,
        "pid": os.getpid(),
    }


def test_ranks_env_and_backend(wg):
    assert len(wg) == N
    out = wg.execute(_whoami)
    masters = {(o["env"]["MASTER_ADDR"], o["env"]["MASTER_PORT"]) for o in out}
    assert len(masters) == 1
    for r, o in enumerate(out):
        assert (o["rank"], o["size"], o["backend"], o["shoal"]) == (r, N, "shoal", True)
        # One node: consecutive ranks, local rank = rank.
        assert o["ctx"] == (r, N, r, N, 0)
        assert o["env"]["RANK"] == str(r) and o["env"]["LOCAL_RANK"] == str(r)
        assert o["env"]["WORLD_SIZE"] == o["env"]["LOCAL_WORLD_SIZE"] == str(N) and o["env"]["NODE_RANK"] == "0"
        assert o["pid"] == wg.workers[r].pid and wg.workers[r].rank == r


def _allreduce(seed):
    import torch
    import torch.distributed as dist

    x = np.random.default_rng(seed + dist.get_rank()).standard_normal(1000).astype(np.float32)
    t = torch.from_numpy(x.copy())
    dist.all_reduce(t)
    m = torch.from_numpy(x.copy())
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    return t.numpy(), m.numpy()


def test_execute_runs_collectives(wg):
    res = wg.execute(_allreduce, seed=7)
    xs = [np.random.default_rng(7 + r).standard_normal(1000).astype(np.float32) for r in range(N)]
    for s, m in res:
        np.testing.assert_allclose(s, np.sum(xs, axis=0), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(m, np.max(xs, axis=0))


def test_execute_single_and_async(wg):
    assert wg.execute_single(2, os.getpid) == wg.workers[2].pid
    refs = wg.execute_async(lambda a, b=0: a * 10 + b, 4, b=2)
    assert ray.get(refs) == [42] * N
    with pytest.raises(IndexError):
        wg.execute_single(N, os.getpid)


def test_gloo_and_shared_cuda_visible_devices(ray_local):
    if ray.cluster_resources().get("GPU", 0) < 4:
        pytest.skip("needs the 4 logical GPUs of the ray_local fixture")

    def probe():
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        own = [str(g) for g in ray.get_runtime_context().get_accelerator_ids()["GPU"]]
        return dist.get_backend(), t.item(), os.environ["CUDA_VISIBLE_DEVICES"], own

    with WorkerGroup(2, resources_per_worker={"CPU": 1, "GPU": 2}, backend="gloo") as g:
        out = g.execute(probe)
        owns = [o[3] for o in out]
        # Each worker was given 2 GPUs; both see all 4 (same node), ranks ordered by lowest GPU id.
        assert sorted(sum(owns, [])) == ["0", "1", "2", "3"]
        assert min(map(int, owns[0])) < min(map(int, owns[1]))
        for backend, s, visible, _ in out:
            assert (backend, s, visible) == ("gloo", 3.0, "0,1,2,3")
        assert [w.cuda_visible_devices for w in g.workers] == ["0,1,2,3"] * 2
    assert g.is_shut_down


def test_invalid_backend(ray_local):
    with pytest.raises(ValueError, match=r"unknown torch.distributed backend 'shaol'.*gloo.*shoal"):
        WorkerGroup(2, backend="shaol")
    with pytest.raises(ValueError, match="unknown"):
        WorkerGroup(2, backend="cpu:shoal,cuda:nope")


def _assert_torn_down(g, actors):
    assert g.is_shut_down and len(g) == 0
    # ray.kill is asynchronous, as in Ray Train's worker group: an actor that was idle may still
    # answer a call made just after it. Within 30 s every one must be gone.
    deadline = time.monotonic() + 30
    for a in actors:
        while True:
            try:
                ray.get(a.metadata.remote(), timeout=max(0.1, deadline - time.monotonic()))
            except ray.exceptions.RayActorError:
                break
            except ray.exceptions.GetTimeoutError:
                pass  # a worker that neither answers nor dies: the assertion below says so
            assert time.monotonic() < deadline, "a worker still answers 30 s after the group was shut down"
            time.sleep(0.1)
    with pytest.raises(RuntimeError, match="shut down"):
        g.execute(os.getpid)


def _raise_on_1():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("bad input on this worker")
    dist.barrier()  # the others wait here for rank 1, which never comes: they must be killed


def test_worker_raises(ray_local):
    g = WorkerGroup(2)
    actors = g.actors
    t0 = time.monotonic()
    with pytest.raises(WorkerGroupError, match=r"rank 1 .*raised ValueError during execute\(_raise_on_1\): bad input") as ei:
        g.execute(_raise_on_1)
    assert time.monotonic() - t0 < 30
    assert ei.value.rank == 1 and isinstance(ei.value.cause, ray.exceptions.RayTaskError)
    _assert_torn_down(g, actors)


def _die_on_1():
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 1:
        os._exit(1)
    dist.all_reduce(torch.ones(1024))


def test_worker_dies(ray_local):
    g = WorkerGroup(2)
    actors = g.actors
    t0 = time.monotonic()
    with pytest.raises(WorkerGroupError, match=r"rank 1 \(pid \d+ on .*\) died during execute\(_die_on_1\)") as ei:
        g.execute(_die_on_1)
    assert time.monotonic() - t0 < 30
    assert ei.value.rank == 1 and isinstance(ei.value.cause, ray.exceptions.RayActorError)
    _assert_torn_down(g, actors)
