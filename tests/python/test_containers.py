"""shoal in containers, simulated with new IPC and mount namespaces (`unshare --ipc --mount`) and a
tmpfs of the container's size on /dev/shm: ranks that do not share /dev/shm talk TCP, and a
/dev/shm too small for the group is an error at group creation, through torch and through Ray.
Skipped where new namespaces cannot be made (they need CAP_SYS_ADMIN)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from harness import can_make_containers, container_argv, free_port


def in_container(size: str, argv, env=None, timeout=120, wait=True):
    cmd = [*container_argv(size), *argv]
    kw = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    if not wait:
        return subprocess.Popen(cmd, **kw)
    return subprocess.run(cmd, timeout=timeout, **kw)


pytestmark = pytest.mark.skipif(not can_make_containers(), reason="cannot make IPC and mount namespaces here")


RANK = textwrap.dedent("""
    import json, sys, torch, torch.distributed as dist
    rank, port = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("shoal", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    t = torch.full((100_001,), float(rank + 1))
    dist.all_reduce(t)
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    print(json.dumps({"sum": t[-1].item(), "transports": backend.transports()}))
    dist.destroy_process_group()
""")


def check_two_ranks_talk_tcp(procs):
    """Both ranks (RANK) summed right, and each reached the other over TCP."""
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out + err
    got = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert [g["sum"] for g in got] == [3.0, 3.0]
    assert [g["transports"] for g in got] == [["self", "tcp"], ["tcp", "self"]]


def test_torch_ranks_in_separate_containers_talk_tcp():
    port = str(free_port())
    check_two_ranks_talk_tcp([in_container("64m", [sys.executable, "-c", RANK, str(r), port], wait=False) for r in range(2)])


def test_torch_rank_in_another_pid_namespace_talks_tcp():
    """Containers of one Kubernetes pod share the hostname and may share /dev/shm, but each has its
    own PID namespace, where a peer's pid (which a rank watches through a pidfd and reads memory
    by) names another process: such ranks talk TCP. Here rank 1 runs in a new PID namespace and
    shares everything else with rank 0."""
    port = str(free_port())
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    argv = [[sys.executable, "-c", RANK, "0", port], ["unshare", "--pid", "--fork", sys.executable, "-c", RANK, "1", port]]
    check_two_ranks_talk_tcp([subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for a in argv])


# Two ranks (forked) in one container whose /dev/shm is too small for their segments: making the
# group raises on both, naming the room needed and free; with SHOAL_TRANSPORT=tcp the group works.
SMALL = textwrap.dedent("""
    import json, multiprocessing as mp, os, sys, torch, torch.distributed as dist

    def rank_main(rank, path, q):
        try:
            dist.init_process_group("shoal", init_method=f"file://{path}", rank=rank, world_size=2)
            t = torch.ones(1000)
            dist.all_reduce(t)
            q.put((rank, "ok", t[0].item()))
            dist.destroy_process_group()
        except Exception as e:
            q.put((rank, type(e).__name__, str(e)))

    out = {}
    for transport in ["", "tcp"]:
        os.environ["SHOAL_TRANSPORT"] = transport
        path = f"{sys.argv[1]}/store-{transport or 'auto'}"
        q = mp.get_context("fork").Queue()
        ps = [mp.get_context("fork").Process(target=rank_main, args=(r, path, q)) for r in range(2)]
        for p in ps: p.start()
        res = sorted(q.get(timeout=100) for _ in ps)
        for p in ps: p.join(timeout=30)
        out[transport or "auto"] = res
    print(json.dumps(out))
""")


def test_torch_small_dev_shm_is_an_error_at_init(tmp_path):
    r = in_container("8m", [sys.executable, "-c", SMALL, str(tmp_path)], timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for rank, kind, msg in out["auto"]:
        assert "not enough shared memory" in msg and "of /dev/shm" in msg and "is free" in msg, (rank, kind, msg)
        assert "SHOAL_TRANSPORT=tcp" in msg, msg
    assert out["tcp"] == [[0, "ok", 2.0], [1, "ok", 2.0]], out


# Ray started inside a container with a small /dev/shm (its object store falls back to /tmp there):
# making a shoal collective group fails on every actor with the same error, and nobody waits for
# the timeout.
RAY = textwrap.dedent("""
    import json, time, ray, ray.util.collective as col

    @ray.remote(num_cpus=0)
    class Rank:
        def init(self, rank):
            try:
                col.init_collective_group(2, rank, backend="shoal", group_name="small shm")
                return "ok"
            except Exception as e:
                return f"{type(e).__name__}: {e}"

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=80 * 1024 * 1024)
    actors = [Rank.remote() for _ in range(2)]
    t0 = time.monotonic()
    res = ray.get([a.init.remote(r) for r, a in enumerate(actors)], timeout=120)
    print(json.dumps({"res": res, "seconds": time.monotonic() - t0}))
    ray.shutdown()
""")


def test_ray_small_dev_shm_is_an_error_at_group_creation():
    pytest.importorskip("ray")
    r = in_container("8m", [sys.executable, "-c", RAY], timeout=240,
                     env={"RAY_object_spilling_directory": "/tmp", "PYTHONWARNINGS": "ignore"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for msg in out["res"]:
        assert "not enough shared memory" in msg and "is free" in msg, msg
        assert "small shm" in msg, msg  # names the Ray group
    assert out["seconds"] < 60, out
