"""shoal across (fake) hosts: 2 hosts x 2 ranks and 2 hosts x 3 ranks made with network, UTS and
mount namespaces (scripts/netns_hosts.py). The store runs on host 0, the ranks are started by the
environment contract of docs/launch.md, each one runs `build/shoal-bench OP --check` as one rank
of the job. Shows from shoal's own log (SHOAL_LOG=info, "group ready ... transports:") that ranks
of one host talk through shared memory and ranks of different hosts through TCP.

Needs root and `ip netns` (skipped otherwise); the fake hosts are removed at the end, even after
a failure. Run alone: `sudo python3 -m pytest -q tests/python/test_multihost.py` (~20-40 s).
"""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import netns_hosts  # noqa: E402

BUILD = os.environ.get("SHOAL_BUILD_DIR", os.path.join(ROOT, "build"))
BENCH = os.path.join(BUILD, "shoal-bench")
STORE = os.path.join(BUILD, "shoal-store")


@pytest.fixture(scope="module")
def hosts():
    ok, why = netns_hosts.available()
    if not ok:
        pytest.skip(why)
    for b in (BENCH, STORE):
        if not os.access(b, os.X_OK):
            pytest.skip(f"{b} not built")
    h = netns_hosts.FakeHosts(2)
    try:
        h.up()
    except (PermissionError, RuntimeError) as e:
        pytest.skip(f"cannot create fake hosts: {e}")
    try:
        yield h
    finally:
        h.down()
    assert not netns_hosts.existing_hosts()


def bench(hosts, layout, op, sizes=("4K", "1M", "16"), extra=(), env=None, **job):
    e = dict(os.environ, SHOAL_LOG="info", SHOAL_TIMEOUT="60")
    e.update(env or {})
    lo, hi, f = sizes
    argv = [BENCH, op, "-n", str(len(layout)), "-b", lo, "-e", hi, "-f", f, "--check",
            "--iters", "3", "--warmup", "1", *extra]
    res = netns_hosts.run_job(hosts, layout, argv, env=e, store_bin=STORE, timeout=90, **job)
    assert res.ok, res.describe()
    return res


def check_transports(res):
    """Every rank logged its transports; same fake host <=> shm, other fake host <=> tcp."""
    got = netns_hosts.transports_from_log("".join(res.errs))
    layout = res.layout
    assert sorted(got) == list(range(len(layout))), res.describe()
    for r, row in got.items():
        want = ["self" if q == r else "shm" if layout[q] == layout[r] else "tcp" for q in range(len(layout))]
        assert row == want, f"rank {r} on {netns_hosts.host_name(layout[r])}: {row} != {want}"


def check_rows(stdout, n, gloo=False):
    """rank 0's table has n data rows, each with check `ok` for shoal (and for Gloo)."""
    rows = [line.split("|") for line in stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert len(rows) == n, stdout
    for cols in rows:
        assert cols[1].split()[-1] == "ok", stdout
        if gloo:
            assert cols[2].split()[-1] == "ok", stdout


def test_fake_hosts_differ(hosts):
    """What shoal's same-host test looks at differs between fake hosts: hostname and /dev/shm."""
    import subprocess
    names, shm = [], []
    for i in range(2):
        argv = hosts.argv(i, ["sh", "-c", f"hostname; touch /dev/shm/shoal-probe-{i}; ls /dev/shm"])
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout.split()
        names.append(out[0]), shm.append(out[1:])
    assert names == ["shoal-h0", "shoal-h1"]
    assert shm == [["shoal-probe-0"], ["shoal-probe-1"]]
    assert not os.path.exists("/dev/shm/shoal-probe-0")


@pytest.mark.parametrize("op", ["allreduce", "allgather", "broadcast", "alltoall"])
def test_collectives_2x2(hosts, op):
    res = bench(hosts, [0, 0, 1, 1], op, extra=["--vs", "gloo"] if op == "allreduce" else [])
    check_transports(res)
    gloo = op == "allreduce" and "gloo: not built in" not in res.outs[0]
    check_rows(res.outs[0], 3, gloo=gloo)
    if gloo:  # Gloo ran across the hosts too, on the fake hosts' addresses
        assert "addr=[10.77.0." in res.outs[0], res.outs[0]


@pytest.mark.parametrize("layout", [[0, 1, 0, 1], [0, 0, 1, 1]], ids=["cross-host", "same-host"])
def test_sendrecv_2x2(hosts, layout):
    """sendrecv is rank 0 -> rank 1: across the hosts (interleaved layout) and within one."""
    res = bench(hosts, layout, "sendrecv", sizes=("4K", "16M", "64"))
    check_transports(res)
    want = "shm" if layout[0] == layout[1] else "tcp"
    assert f"(rank 0 -> 1: {want})" in res.outs[0]
    check_rows(res.outs[0], 3)


@pytest.mark.parametrize("op", ["allreduce", "alltoall"])
def test_collectives_2x3(hosts, op):
    res = bench(hosts, [0, 0, 0, 1, 1, 1], op, sizes=("6K", "1536K", "16"))
    check_transports(res)
    check_rows(res.outs[0], 3)


@pytest.mark.parametrize("op", ["allreduce", "broadcast", "reduce", "allgather"])
def test_hierarchical_chosen_and_right(hosts, op, tmp_path):
    """Ranks on two hosts with shared memory inside each: the automatic choice is the hierarchical
    algorithm at every size (the JSON names what ran), and every result checks, in a layout
    whose hosts are neither consecutive nor of equal size."""
    out = tmp_path / f"{op}.json"
    res = bench(hosts, [0, 1, 0, 1, 0], op, sizes=("5K", "5M", "32"), extra=["--json", str(out)])
    check_transports(res)
    check_rows(res.outs[0], 3)
    rows = json.loads(out.read_text())["rows"]
    assert [r["shoal_algo"] for r in rows] == ["hier"] * 3, rows
    assert all(r["check"] == "ok" for r in rows), rows


# ---- Which address a rank advertises (src/transport/net_address.h) ----------------------------


def advertised(res):
    """rank -> the host part of the address it advertised for its TCP links (SHOAL_LOG=debug)."""
    got = {}
    for r, err in enumerate(res.errs):
        m = re.search(r"tcp: listening on (\[[^\]]+\]|[^:\s]+):\d+", err)
        assert m, f"rank {r} logged no TCP address:\n{err[-2000:]}"
        got[r] = m.group(1).strip("[]")
    return got


@pytest.mark.parametrize("spec,net", [("eth1", 2), ("=eth0", 1), ("^eth0,lo", 2), ("^=eth1,lo", 1)])
def test_socket_ifname_picks_the_network(hosts, spec, net):
    """SHOAL_SOCKET_IFNAME in NCCL's syntax chooses the interface whose address a rank advertises
    (the store is on eth0's network either way), and the job runs over it."""
    layout = [0, 1, 0, 1]
    res = bench(hosts, layout, "allreduce", sizes=("4K", "1M", "256"), env={"SHOAL_LOG": "debug", "SHOAL_SOCKET_IFNAME": spec})
    check_transports(res)
    addr = hosts.addr2 if net == 2 else hosts.addr
    assert advertised(res) == {r: addr(h) for r, h in enumerate(layout)}


def test_store_over_loopback_advertises_an_interface(hosts):
    """Ranks on host 0 reach the store as 127.0.0.1 (as a host whose name resolves to loopback
    does): they must not advertise loopback to the ranks on host 1, but eth0's address."""
    layout = [0, 1, 0, 1]

    def rank_env(r, port):
        return {"SHOAL_STORE": f"127.0.0.1:{port}" if layout[r] == 0 else f"{hosts.addr(0)}:{port}"}

    res = bench(hosts, layout, "allgather", sizes=("4K", "1M", "256"), env={"SHOAL_LOG": "debug"},
                store_host="0.0.0.0", rank_env=rank_env)
    check_transports(res)
    assert advertised(res) == {r: hosts.addr(h) for r, h in enumerate(layout)}


@pytest.mark.parametrize("store_v6", [True, False], ids=["store-and-links", "links"])
def test_ipv6_end_to_end(hosts, store_v6):
    """IPv6 for the store and the links (the store at [fd77::1]), or for the links alone
    (SHOAL_SOCKET_FAMILY=AF_INET6 with the store on IPv4: the store's address is of the other
    family, so the rank advertises the first interface's IPv6 address, eth0's)."""
    layout = [0, 1, 0, 1]
    env = {"SHOAL_LOG": "debug"}
    job = {}
    if store_v6:
        job = dict(store_host=hosts.addr6(0), rank_env=lambda r, port: {"SHOAL_STORE": f"[{hosts.addr6(0)}]:{port}"})
    else:
        env.update(SHOAL_SOCKET_FAMILY="AF_INET6")
    res = bench(hosts, layout, "alltoall", sizes=("4K", "1M", "256"), env=env, **job)
    check_transports(res)
    assert advertised(res) == {r: hosts.addr6(h) for r, h in enumerate(layout)}


def test_link_down_fails_cleanly(hosts):
    """Host 1's link drops (its veth taken down) in the middle of a stream of allreduces: no RST,
    no dead process — the ranks must still all fail within the op deadline (SHOAL_TIMEOUT=3 s) plus
    a margin, with an error that names the op and the ranks waited for, and leave no segment in
    either host's /dev/shm. The link comes back up afterwards for the other tests."""
    import subprocess
    import threading
    import time

    layout = [0, 0, 1, 1]
    e = dict(os.environ, SHOAL_LOG="warn", SHOAL_TIMEOUT="3")
    argv = [BENCH, "allreduce", "-n", "4", "-b", "1M", "-e", "1M", "--iters", "1000000", "--warmup", "1"]
    down_at = []

    def drop():
        down_at.append(time.monotonic())
        subprocess.run(["ip", "-n", netns_hosts.host_name(1), "link", "set", "eth0", "down"], check=True)

    timer = threading.Timer(3.0, drop)
    timer.start()
    try:
        res = netns_hosts.run_job(hosts, layout, argv, env=e, store_bin=STORE, timeout=60)
        ended = time.monotonic()
    finally:
        timer.cancel()
        subprocess.run(["ip", "-n", netns_hosts.host_name(1), "link", "set", "eth0", "up"], check=True)
    assert down_at, "the link was never taken down (the job ended first)"
    assert all(rc != 0 for rc in res.rcs), res.describe()
    assert ended - down_at[0] < 3 + 10, f"the job took {ended - down_at[0]:.1f} s to fail\n{res.describe()}"
    for r in range(4):
        err = res.errs[r] + res.outs[r]
        assert "allreduce" in err and ("timed out" in err or "aborted" in err), f"rank {r}:\n{res.describe()}"
    for h in (0, 1):
        left = subprocess.run(hosts.argv(h, ["sh", "-c", "ls /dev/shm | grep '^shoal-[0-9]' || true"]),
                              capture_output=True, text=True).stdout.split()
        assert not left, f"left in {netns_hosts.host_name(h)}:/dev/shm: {left}"
    # The hosts reach each other again (later tests rely on it): a job across them works.
    check_transports(bench(hosts, [0, 1], "sendrecv", sizes=("4K", "64K", "16")))


TORCH_RANK = r"""
import os, sys, torch, torch.distributed as dist
import shoal
rank, world, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("shoal", init_method=f"tcp://{store}:29613", rank=rank, world_size=world)
t = torch.arange(1000, dtype=torch.float32) * (rank + 1)
dist.all_reduce(t)
pg = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
print("RESULT", t[:3].tolist(), " ".join(pg.transports()), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("store", ["10.77.0.1", "[fd77::1]"], ids=["ipv4", "ipv6"])
def test_torch_across_hosts(hosts, store):
    """torch.distributed on shoal with a torch TCPStore (init_method tcp://, over IPv4 or IPv6),
    one rank per host pair, no SHOAL_HOST: each rank must advertise its address on the route to
    the store, not 127.0.0.1, or the TCP links across hosts cannot form."""
    import subprocess

    layout = [0, 0, 1]
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_HOST"}
    env["SHOAL_TIMEOUT"] = "30"
    env["SHOAL_LOG"] = "debug"
    procs = [hosts.run(h, [sys.executable, "-c", TORCH_RANK, str(r), str(len(layout)), store], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r, h in enumerate(layout)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)
    for r, out in enumerate(outs):
        line = [x for x in out.splitlines() if x.startswith("RESULT")][0]
        assert line.startswith("RESULT [0.0, 6.0, 12.0]"), out
        want = " ".join("self" if q == r else "shm" if layout[q] == layout[r] else "tcp" for q in range(3))
        assert line.endswith(want), (r, line)
        # The links use the store's family: the address on the route to it.
        addr = hosts.addr6(layout[r]) if store.startswith("[") else hosts.addr(layout[r])
        assert f"tcp: listening on {'[' + addr + ']' if ':' in addr else addr}:" in out, out
