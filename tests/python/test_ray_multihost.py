"""shoal in a Ray cluster across (fake) hosts: the Ray head on fake host 0 (10.77.0.1), a Ray
worker node on fake host 1 (10.77.0.2), both made with network, UTS and mount namespaces by
scripts/netns_hosts.py. The Ray driver must reach 10.77.0.x, so it runs on fake host 0 too: each
test runs this file as a script there (`python test_ray_multihost.py PART`), the script connects
to the cluster, checks its part and exits non-zero (with the traceback) on a wrong result.

1. `ray.util.collective` with backend "shoal": 4 actors, 2 pinned to each host (custom resources
   host0/host1); allreduce, allgather, broadcast, send/recv checked against numpy; each rank's
   `transports()` is shm to the actor on its host and tcp to the other host's.
2. The direct transport: `@ray.method(tensor_transport="shoal")` moves a tensor and a dict of
   tensors from an actor on host 0 to one on host 1; values checked.
3. `shoal.ray.WorkerGroup(4, {"CPU": 2}, placement_strategy="SPREAD")`: 2 workers per host
   (node ids differ), ranks node by node, `dist.all_reduce` checked against numpy, transports
   shm/tcp.

Needs root, `ip netns` and ray (skipped otherwise). Teardown stops the Ray processes of each fake
host only (not `ray stop`, which kills every Ray process of the machine, other runs' included:
the fake hosts share the machine's PID namespace), then removes the fake hosts.
Run alone: `sudo .venv/bin/python -m pytest -q tests/python/test_ray_multihost.py` (~40 s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

PORT = 6380  # GCS port on fake host 0; its network namespace is fresh, so the port is free
HEAD = "10.77.0.1"
RESULT = "SHOAL-RESULT "


# ------------------------------------------------------------------------------------------------
# The driver side: runs on fake host 0 as `python test_ray_multihost.py PART`.
# ------------------------------------------------------------------------------------------------

def _driver(part: str) -> None:
    import numpy as np
    import ray

    import shoal  # noqa: F401  registers the backend and the transport in the driver

    ray.init(address=f"{HEAD}:{PORT}", logging_level="warning", log_to_driver=True)
    nodes = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert sorted(nodes) == ["10.77.0.1", "10.77.0.2"], ray.nodes()
    out = {"part": part}
    if part == "collective":
        out.update(_collective(np, ray))
    elif part == "transport":
        out.update(_transport(np, ray))
    elif part == "worker_group":
        out.update(_worker_group(np, ray, nodes))
    else:
        raise SystemExit(f"unknown part {part!r}")
    print(RESULT + json.dumps(out), flush=True)
    ray.shutdown()


def _pinned(cls, host: int):
    """cls placed on fake host `host` by its custom resource (and no CPU)."""
    return cls.options(num_cpus=0, resources={f"host{host}": 1})


def _collective(np, ray):
    import ray.util.collective as col

    @ray.remote
    class Rank:
        def __init__(self):
            import shoal  # noqa: F401

        def where(self):
            import socket
            return socket.gethostname(), ray.util.get_node_ip_address()

        def setup(self, world, rank):
            col.init_collective_group(world, rank, backend="shoal", group_name="mh")
            self.rank, self.world = rank, world
            return col.get_group_handle("mh").transports()

        def ops(self):
            r, w = self.rank, self.world
            n = 300_000  # > 1 MiB of float32: a large message on both shm and tcp
            res = {}
            x = np.arange(n, dtype=np.float32) * (r + 1)
            col.allreduce(x, group_name="mh")
            res["allreduce"] = x
            y = np.full(1000, r, dtype=np.int64)
            outs = [np.zeros(1000, np.int64) for _ in range(w)]
            col.allgather(outs, y, group_name="mh")
            res["allgather"] = np.stack(outs)
            b = np.arange(n, dtype=np.float64) if r == 3 else np.zeros(n, np.float64)
            col.broadcast(b, src_rank=3, group_name="mh")  # root on host 1
            res["broadcast"] = b
            # send/recv: 0 -> 1 (same host, shm) and 0 -> 2 (other host, tcp); 3 -> 0 (tcp back).
            p = np.zeros(n, np.float32)
            if r == 0:
                col.send(np.arange(n, dtype=np.float32) + 1, 1, group_name="mh")
                col.send(np.arange(n, dtype=np.float32) + 2, 2, group_name="mh")
                col.recv(p, 3, group_name="mh")
            elif r in (1, 2):
                col.recv(p, 0, group_name="mh")
            else:
                col.send(np.arange(n, dtype=np.float32) + 3, 0, group_name="mh")
            res["p2p"] = p
            col.barrier(group_name="mh")
            return res

        def teardown(self):
            col.destroy_collective_group("mh")

    layout = [0, 0, 1, 1]
    ranks = [_pinned(Rank, h).remote() for h in layout]
    where = ray.get([a.where.remote() for a in ranks], timeout=120)
    assert [w[0] for w in where] == ["shoal-h0", "shoal-h0", "shoal-h1", "shoal-h1"], where
    assert [w[1] for w in where] == [HEAD, HEAD, "10.77.0.2", "10.77.0.2"], where
    transports = ray.get([a.setup.remote(4, r) for r, a in enumerate(ranks)], timeout=120)
    for r, row in enumerate(transports):
        want = ["self" if q == r else "shm" if layout[q] == layout[r] else "tcp" for q in range(4)]
        assert row == want, f"rank {r}: {row} != {want}"
    got = ray.get([a.ops.remote() for a in ranks], timeout=120)
    n = 300_000
    base = np.arange(n, dtype=np.float32)
    for r, g in enumerate(got):
        np.testing.assert_array_equal(g["allreduce"], base * (1 + 2 + 3 + 4))
        np.testing.assert_array_equal(g["allgather"], np.repeat(np.arange(4, dtype=np.int64)[:, None], 1000, 1))
        np.testing.assert_array_equal(g["broadcast"], np.arange(n, dtype=np.float64))
        want_p2p = {0: base + 3, 1: base + 1, 2: base + 2, 3: np.zeros(n, np.float32)}[r]
        np.testing.assert_array_equal(g["p2p"], want_p2p)
    ray.get([a.teardown.remote() for a in ranks], timeout=60)
    return {"hosts": [w[0] for w in where], "transports": transports}


def _transport(np, ray):
    import torch
    from ray.experimental.collective import create_collective_group, destroy_collective_group

    @ray.remote
    class Peer:
        def __init__(self):
            import shoal  # noqa: F401

        def host(self):
            import socket
            return socket.gethostname()

        @ray.method(tensor_transport="shoal")
        def tensor(self):
            return torch.arange(1 << 20, dtype=torch.float32) * 0.5  # 4 MiB

        @ray.method(tensor_transport="shoal")
        def state(self):
            return {"w": torch.arange(512 * 512, dtype=torch.float64).reshape(512, 512),
                    "b": torch.arange(10, dtype=torch.int32),
                    "nested": {"h": torch.ones(3, 4, dtype=torch.bfloat16) * 3}}

        def take(self, x):
            import socket

            def host_side(v):
                if isinstance(v, dict):
                    return {k: host_side(u) for k, u in v.items()}
                # bfloat16 has no numpy dtype: float32 holds its values exactly.
                return (v.float() if v.dtype == torch.bfloat16 else v).numpy().copy(), str(v.dtype), tuple(v.shape)

            return socket.gethostname(), host_side(x)

    a, b = _pinned(Peer, 0).remote(), _pinned(Peer, 1).remote()
    assert ray.get([a.host.remote(), b.host.remote()], timeout=120) == ["shoal-h0", "shoal-h1"]
    create_collective_group([a, b], backend="shoal", name="mh-rdt")
    try:
        where, (t, dtype, shape) = ray.get(b.take.remote(a.tensor.remote()), timeout=120)
        assert where == "shoal-h1"
        assert (dtype, shape) == ("torch.float32", (1 << 20,))
        np.testing.assert_array_equal(t, np.arange(1 << 20, dtype=np.float32) * 0.5)
        where, d = ray.get(b.take.remote(a.state.remote()), timeout=120)
        assert where == "shoal-h1"
        assert sorted(d) == ["b", "nested", "w"]
        w, wd, ws = d["w"]
        assert (wd, ws) == ("torch.float64", (512, 512))
        np.testing.assert_array_equal(w, np.arange(512 * 512, dtype=np.float64).reshape(512, 512))
        bb, bd, bs = d["b"]
        assert (bd, bs) == ("torch.int32", (10,))
        np.testing.assert_array_equal(bb, np.arange(10, dtype=np.int32))
        h, hd, hs = d["nested"]["h"]
        assert (hd, hs) == ("torch.bfloat16", (3, 4))
        np.testing.assert_array_equal(h, np.full((3, 4), 3, np.float32))
        # And back: host 1 -> host 0.
        where, (t, _, _) = ray.get(a.take.remote(b.tensor.remote()), timeout=120)
        assert where == "shoal-h0"
        np.testing.assert_array_equal(t, np.arange(1 << 20, dtype=np.float32) * 0.5)
    finally:
        destroy_collective_group("mh-rdt")
    return {"transfers": 3}


def _wg_step(n):
    import numpy as np
    import torch
    import torch.distributed as dist

    import shoal.torch  # noqa: F401

    r = dist.get_rank()
    t = torch.from_numpy(np.arange(n, dtype=np.float32) * (r + 1))
    dist.all_reduce(t)
    import socket
    assert shoal.torch.is_shoal_group()
    pg = dist.distributed_c10d._get_default_group()
    return socket.gethostname(), t.numpy(), list(pg._get_backend(torch.device("cpu")).transports())


def _worker_group(np, ray, nodes):
    from shoal.ray import WorkerGroup

    # SPREAD is best effort; 2 CPUs per worker on nodes of 4 CPUs makes the 2 + 2 split certain.
    with WorkerGroup(4, resources_per_worker={"CPU": 2}, placement_strategy="SPREAD",
                     start_timeout_s=90, timeout_s=120) as wg:
        ws = wg.workers
        by_node = [w.node_id for w in ws]
        assert len(set(by_node)) == 2, ws
        # Ranks go node by node, the driver's node (host 0) first; 2 workers on each.
        assert by_node == [nodes[HEAD]] * 2 + [nodes["10.77.0.2"]] * 2, ws
        assert [w.hostname for w in ws] == ["shoal-h0", "shoal-h0", "shoal-h1", "shoal-h1"], ws
        assert [(w.local_rank, w.node_rank) for w in ws] == [(0, 0), (1, 0), (0, 1), (1, 1)], ws
        n = 100_000
        got = wg.execute(_wg_step, n)
        for _host, t, _ in got:
            np.testing.assert_array_equal(t, np.arange(n, dtype=np.float32) * (1 + 2 + 3 + 4))
        return {"hosts": [g[0] for g in got], "nodes": by_node, "transports": [g[2] for g in got]}


# ------------------------------------------------------------------------------------------------
# The pytest side: fake hosts, the Ray cluster, one driver run per part.
# ------------------------------------------------------------------------------------------------

if __name__ != "__main__":
    import pytest

    import netns_hosts

    pytest.importorskip("ray")

    RAY = os.path.join(os.path.dirname(sys.executable), "ray")

    def _env():
        """Environment of the Ray nodes and the drivers: Ray 2.60 authenticates with a token;
        the cluster gets its own (RAY_AUTH_TOKEN, in every node, worker and driver), so that
        neither ~/.ray/auth_token nor another run's cluster is involved."""
        import secrets
        e = dict(os.environ, SHOAL_TIMEOUT="60", RAY_USAGE_STATS_ENABLED="0",
                 RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
        e.pop("RAY_AUTH_TOKEN_PATH", None)
        e["PATH"] = os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", "")
        return e

    def _stop_host(hosts, i, grace=3.0):
        """SIGTERM every process in fake host i's network namespace (its Ray node and workers),
        then SIGKILL what is left after `grace` s. Scoped to the fake host, unlike `ray stop`."""
        def pids():
            r = subprocess.run(["ip", "netns", "pids", hosts.name(i)], capture_output=True, text=True)
            return [int(p) for p in r.stdout.split()]

        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            for p in pids():
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while pids() and time.monotonic() < deadline:
                time.sleep(0.2)
            if not pids():
                return

    @pytest.fixture(scope="module")
    def cluster():
        ok, why = netns_hosts.available()
        if not ok:
            pytest.skip(why)
        hosts = netns_hosts.FakeHosts(2)
        try:
            hosts.up()
        except (PermissionError, RuntimeError) as e:
            pytest.skip(f"cannot create fake hosts: {e}")
        # Our own temp dir (short: Ray's Unix sockets live there), not /tmp/ray of other runs.
        tmp = tempfile.mkdtemp(prefix="shoal-rmh-", dir="/tmp")
        env = _env()
        common = ["--num-cpus=4", "--object-store-memory=100000000", "--disable-usage-stats", "--temp-dir", tmp]
        try:
            head = [RAY, "start", "--head", f"--node-ip-address={HEAD}", f"--port={PORT}",
                    "--resources", '{"host0": 4}', "--include-dashboard=false", *common]
            worker = [RAY, "start", f"--address={HEAD}:{PORT}", f"--node-ip-address={hosts.addr(1)}",
                      "--resources", '{"host1": 4}', *common]
            for i, argv in ((0, head), (1, worker)):
                r = subprocess.run(hosts.argv(i, argv, cwd=ROOT), env=env, capture_output=True, text=True, timeout=90)
                assert r.returncode == 0, f"host {i}: {' '.join(argv)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
            yield hosts, env
        finally:
            for i in (1, 0):
                _stop_host(hosts, i)
            hosts.down()
            subprocess.run(["rm", "-rf", tmp])
        assert not netns_hosts.existing_hosts()

    def drive(cluster, part, timeout=150):
        hosts, env = cluster
        # stdout apart from stderr: the workers' logs Ray forwards to the driver's stderr may end
        # without a newline, and a result line printed after one would not start a line.
        p = hosts.run(0, [sys.executable, os.path.abspath(__file__), part], env=env, cwd=ROOT,
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            pytest.fail(f"driver {part} did not finish in {timeout} s\n{out}\n{err}")
        assert p.returncode == 0, f"driver {part}: exit {p.returncode}\n{out}\n{err}"
        lines = [ln for ln in out.splitlines() if ln.startswith(RESULT)]
        assert lines, f"{out}\n{err}"
        return json.loads(lines[-1][len(RESULT):])

    def test_collective_across_hosts(cluster):
        res = drive(cluster, "collective")
        assert res["hosts"] == ["shoal-h0", "shoal-h0", "shoal-h1", "shoal-h1"]
        assert res["transports"] == [["self", "shm", "tcp", "tcp"], ["shm", "self", "tcp", "tcp"],
                                     ["tcp", "tcp", "self", "shm"], ["tcp", "tcp", "shm", "self"]]

    def test_direct_transport_across_hosts(cluster):
        assert drive(cluster, "transport")["transfers"] == 3

    def test_worker_group_across_hosts(cluster):
        res = drive(cluster, "worker_group")
        assert res["hosts"] == ["shoal-h0", "shoal-h0", "shoal-h1", "shoal-h1"]
        assert len(set(res["nodes"])) == 2
        assert res["transports"] == [["self", "shm", "tcp", "tcp"], ["shm", "self", "tcp", "tcp"],
                                     ["tcp", "tcp", "self", "shm"], ["tcp", "tcp", "shm", "self"]]


if __name__ == "__main__":
    _driver(sys.argv[1])
