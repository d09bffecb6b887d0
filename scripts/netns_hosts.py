#!/usr/bin/env python3
"""Fake hosts on one machine, for multi-host tests of shoal (stdlib only, needs root).

A fake host `shoal-hI` differs from the machine and from the other fake hosts the way a real host
does, as far as shoal can tell (src/core/rendezvous.cpp judges "same host" by hostname + boot id
+ PID namespace + a probe of a shared-memory segment, and "reachable over loopback" by boot id +
network namespace):

* network:  its own network namespace `shoal-hI` (`ip netns`), one veth `eth0` with addresses
            10.77.0.(I+1)/24 and fd77::(I+1)/64 (MTU default), plugged into the bridge `br0` of
            the namespace `shoal-br`, and a second network as real hosts often have: veth `eth1`,
            10.78.0.(I+1)/24, on the bridge `br1`; `lo` up. Traffic between fake hosts goes
            through the veth pairs and the bridges, never through the machine's own interfaces.
* hostname: its own UTS namespace, hostname `shoal-hI` (so the host identity differs; the boot
            id cannot differ and does not need to);
* /dev/shm: its own mount namespace with a private tmpfs on /dev/shm (so the shared-memory
            probe of a rank on another fake host fails, as it would on another machine).

The UTS and mount namespaces are kept alive by bind mounts under /run/shoal-hosts (as `ip netns`
keeps network namespaces under /run/netns), so every process started on host I with `run()` /
`exec` enters the *same* three namespaces (`nsenter`) and sees the others of its host.

Python:

    from netns_hosts import FakeHosts, available
    ok, why = available()            # False + reason when not root / no `ip netns` / no unshare
    with FakeHosts(2) as hosts:      # up(); down() on exit, even after an exception
        p = hosts.run(0, ["build/shoal-store", "--port", "29500", "--host", hosts.addr(0)])
        ...

CLI:

    scripts/netns_hosts.py up [-n N]            create N fake hosts (default 2); prints them
    scripts/netns_hosts.py exec HOST -- CMD...  run CMD on fake host HOST (index or name)
    scripts/netns_hosts.py down                 remove every fake host (idempotent)
    scripts/netns_hosts.py status               list the fake hosts that exist

Exit status 77 (the automake/ctest "skip" code) when the machine does not allow it (not root, no
`ip netns`, no unshare/nsenter, or namespace creation refused), so CI without the rights skips.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import signal
import subprocess
import sys
import time

PREFIX = "shoal-h"           # network namespaces shoal-h0, shoal-h1, ...
BRIDGE_NS = "shoal-br"       # namespace holding the bridge
BRIDGE = "br0"
SUBNET = "10.77.0"           # host I is 10.77.0.(I+1)/24 on eth0 (and fd77::(I+1)/64)
SUBNET2 = "10.78.0"          # and 10.78.0.(I+1)/24 on eth1
STATE = "/run/shoal-hosts"   # bind mounts keeping the UTS and mount namespaces alive
SKIP = 77


def _sh(*argv: str, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess:
    r = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


def available() -> tuple[bool, str]:
    """(True, "") when fake hosts can be made here; else (False, why)."""
    if os.geteuid() != 0:
        return False, "fake hosts need root (network, UTS and mount namespaces)"
    for tool in ("ip", "unshare", "nsenter", "mount", "umount"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` not found"
    try:
        r = _sh("ip", "netns", "list", check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return False, f"`ip netns` unavailable: {e}"
    if r.returncode != 0:
        return False, f"`ip netns` unavailable: {r.stderr.strip()}"
    return True, ""


def _netns_list() -> list[str]:
    r = _sh("ip", "netns", "list", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _is_mountpoint(path: str) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def host_name(i: int) -> str:
    return f"{PREFIX}{i}"


def host_addr(i: int) -> str:
    return f"{SUBNET}.{i + 1}"


def host_addr2(i: int) -> str:
    """The address of host i on its second network (eth1)."""
    return f"{SUBNET2}.{i + 1}"


def host_addr6(i: int) -> str:
    """The IPv6 address of host i on eth0."""
    return f"fd77::{i + 1:x}"


class FakeHosts:
    """N fake hosts. up() creates them (removing leftovers first), down() removes them all."""

    def __init__(self, n: int = 2):
        if n < 1 or n > 200:
            raise ValueError("1 <= n <= 200")
        self.n = n
        self._procs: list[subprocess.Popen] = []
        self._up = False

    # ---- lifetime -------------------------------------------------------------------------
    def __enter__(self) -> "FakeHosts":
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> None:
        ok, why = available()
        if not ok:
            raise PermissionError(why)
        down()  # leftovers of an earlier run
        self._up = True
        atexit.register(self.down)
        try:
            self._create()
        except BaseException:
            self.down()
            raise

    def _create(self) -> None:
        os.makedirs(STATE, exist_ok=True)
        if not _is_mountpoint(STATE):
            # A mount namespace may only be bind-mounted onto a file of a private mount (else the
            # bind would propagate into the namespace itself): same trick as /run/netns.
            _sh("mount", "--bind", STATE, STATE)
        _sh("mount", "--make-private", STATE)
        _sh("ip", "netns", "add", BRIDGE_NS)
        for br in (BRIDGE, "br1"):
            _sh("ip", "-n", BRIDGE_NS, "link", "add", br, "type", "bridge")
            _sh("ip", "-n", BRIDGE_NS, "link", "set", br, "up")
        _sh("ip", "-n", BRIDGE_NS, "link", "set", "lo", "up")
        for i in range(self.n):
            name = host_name(i)
            _sh("ip", "netns", "add", name)
            for dev, port, br, addr in (("eth0", f"h{i}", BRIDGE, host_addr(i)), ("eth1", f"g{i}", "br1", host_addr2(i))):
                # veth pair created straight into the two namespaces: no name in the machine's own.
                _sh("ip", "link", "add", dev, "netns", name, "type", "veth", "peer", "name", port, "netns", BRIDGE_NS)
                _sh("ip", "-n", BRIDGE_NS, "link", "set", port, "master", br)
                _sh("ip", "-n", BRIDGE_NS, "link", "set", port, "up")
                _sh("ip", "-n", name, "addr", "add", f"{addr}/24", "dev", dev)
                _sh("ip", "-n", name, "link", "set", dev, "up")
            # nodad: usable at once (duplicate address detection would hold it back ~1 s);
            # keep_addr_on_down: the address survives a test taking the link down and up.
            _sh("ip", "netns", "exec", name, "sysctl", "-qw", "net.ipv6.conf.eth0.keep_addr_on_down=1")
            _sh("ip", "-n", name, "addr", "add", f"{host_addr6(i)}/64", "dev", "eth0", "nodad")
            _sh("ip", "-n", name, "link", "set", "lo", "up")
            uts, mnt = f"{STATE}/{name}.uts", f"{STATE}/{name}.mnt"
            for f in (uts, mnt):
                open(f, "w").close()
            # Persistent UTS + mount namespaces: hostname, private tmpfs on /dev/shm.
            _sh("unshare", f"--uts={uts}", f"--mount={mnt}", "--propagation", "private", "sh", "-c",
                f"hostname {name} && mount -t tmpfs -o mode=1777 shoal-shm-{i} /dev/shm")
        # Wait until every host reaches host 0 (carrier, bridge ports forwarding).
        if shutil.which("ping"):
            deadline = time.time() + 10
            for i in range(1, self.n):
                while subprocess.run(host_argv(i, ["ping", "-c1", "-W1", host_addr(0)]),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode:
                    if time.time() > deadline:
                        raise RuntimeError(f"{host_name(i)} cannot reach {host_addr(0)}")
                    time.sleep(0.1)

    def down(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL) if _own_pgrp(p) else p.kill()
                except ProcessLookupError:
                    pass
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        if self._up:
            down()
            self._up = False

    # ---- processes ------------------------------------------------------------------------
    def addr(self, i: int) -> str:
        return host_addr(i)

    def addr2(self, i: int) -> str:
        return host_addr2(i)

    def addr6(self, i: int) -> str:
        return host_addr6(i)

    def name(self, i: int) -> str:
        return host_name(i)

    def argv(self, i: int, argv: list[str], cwd: str | None = None) -> list[str]:
        return host_argv(i, argv, cwd)

    def run(self, i: int, argv: list[str], env: dict | None = None, **popen_kw) -> subprocess.Popen:
        """Start argv on fake host i (its netns + UTS + mount namespaces). env: the whole
        environment (default: this process's). The process gets its own process group; down()
        kills the ones still running."""
        if not 0 <= i < self.n:
            raise IndexError(f"no fake host {i}")
        popen_kw.setdefault("start_new_session", True)
        p = subprocess.Popen(host_argv(i, argv, popen_kw.pop("cwd", None)), env=dict(os.environ) if env is None else env, **popen_kw)
        self._procs.append(p)
        return p


def _own_pgrp(p: subprocess.Popen) -> bool:
    try:
        return os.getpgid(p.pid) == p.pid
    except ProcessLookupError:
        return False


def host_argv(i: int, argv: list[str], cwd: str | None = None) -> list[str]:
    """argv wrapped to run on fake host i. Entering a mount namespace resets the working directory
    to its root, hence --wd (default: the current directory)."""
    name = host_name(i)
    return ["nsenter", f"--net=/run/netns/{name}", f"--uts={STATE}/{name}.uts", f"--mount={STATE}/{name}.mnt",
            f"--wd={os.path.abspath(cwd or os.getcwd())}", "--", *argv]


def existing_hosts() -> list[str]:
    return sorted((n for n in _netns_list() if n.startswith(PREFIX) and n[len(PREFIX):].isdigit()),
                  key=lambda n: int(n[len(PREFIX):]))


def down() -> None:
    """Remove every fake host and the bridge namespace; kill what still runs in them. Idempotent."""
    ours = [n for n in _netns_list() if n == BRIDGE_NS or (n.startswith(PREFIX) and n[len(PREFIX):].isdigit())]
    for ns in ours:
        r = _sh("ip", "netns", "pids", ns, check=False)
        for pid in r.stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    for ns in ours:
        _sh("ip", "netns", "del", ns, check=False)
    if os.path.isdir(STATE):
        for f in os.listdir(STATE):
            path = f"{STATE}/{f}"
            if _is_mountpoint(path):
                _sh("umount", "-l", path, check=False)
            try:
                os.unlink(path)
            except OSError:
                pass
        if _is_mountpoint(STATE):
            _sh("umount", "-l", STATE, check=False)
        try:
            os.rmdir(STATE)
        except OSError:
            pass


class JobResult:
    """What each rank of a job did: returncode, stdout, stderr (lists indexed by rank)."""

    def __init__(self, layout, rcs, outs, errs):
        self.layout, self.rcs, self.outs, self.errs = layout, rcs, outs, errs

    @property
    def ok(self) -> bool:
        return all(rc == 0 for rc in self.rcs)

    def describe(self) -> str:
        s = []
        for r, h in enumerate(self.layout):
            s.append(f"--- rank {r} on {host_name(h)}: exit {self.rcs[r]}\n{self.outs[r]}{self.errs[r]}")
        return "\n".join(s)


def run_job(hosts: FakeHosts, layout: list[int], argv: list[str], env: dict | None = None,
            store_bin: str = "build/shoal-store", timeout: float = 120, store_host: str | None = None,
            rank_env=None) -> JobResult:
    """Run a shoal job by the environment contract of docs/launch.md: `shoal-store` on fake host 0
    (listening on `store_host`, default 10.77.0.1, a free port), rank r on fake host layout[r] with
    SHOAL_RANK, SHOAL_WORLD_SIZE, SHOAL_LOCAL_RANK, SHOAL_STORE=<store_host>:PORT,
    SHOAL_STORE_SERVER=0 on top of `env` (default: this process's environment), and on top of those
    `rank_env(rank, port)` if given. Waits for every rank (kills all at `timeout`, then raises
    TimeoutError); stops the store."""
    import tempfile
    base = dict(os.environ) if env is None else dict(env)
    store = hosts.run(0, [store_bin, "--port", "0", "--host", store_host or hosts.addr(0)], env=base,
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    procs: list[subprocess.Popen] = []
    try:
        line = store.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"shoal-store did not start: {line!r} {store.stdout.read() if store.poll() is not None else ''}")
        store_addr = line.split("listening on", 1)[1].strip()
        with tempfile.TemporaryDirectory(prefix="shoal-job-") as tmp:
            files = []
            for r, h in enumerate(layout):
                e = dict(base)
                e.update(SHOAL_RANK=str(r), SHOAL_WORLD_SIZE=str(len(layout)),
                         SHOAL_LOCAL_RANK=str(layout[:r].count(h)), SHOAL_STORE=store_addr, SHOAL_STORE_SERVER="0")
                if rank_env:
                    e.update(rank_env(r, int(store_addr.rsplit(":", 1)[1])))
                out, err = open(f"{tmp}/{r}.out", "w+"), open(f"{tmp}/{r}.err", "w+")
                files.append((out, err))
                procs.append(hosts.run(h, argv, env=e, stdout=out, stderr=err, stdin=subprocess.DEVNULL))
            deadline = time.time() + timeout
            timed_out = False
            for p in procs:
                try:
                    p.wait(timeout=max(0.1, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    timed_out = True
                    break
            if timed_out:
                for p in procs:
                    if p.poll() is None:
                        os.killpg(p.pid, signal.SIGKILL)
                for p in procs:
                    p.wait()
            outs, errs = [], []
            for out, err in files:
                out.seek(0), err.seek(0)
                outs.append(out.read()), errs.append(err.read())
                out.close(), err.close()
            res = JobResult(layout, [p.returncode for p in procs], outs, errs)
            if timed_out:
                raise TimeoutError(f"job {argv} did not finish in {timeout} s\n{res.describe()}")
            return res
    finally:
        for p in [*procs, store]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if store.stdout:
            store.stdout.close()


def transports_from_log(stderr: str) -> dict[int, list[str]]:
    """rank -> [transport to rank 0, 1, ...] from the SHOAL_LOG=info line each rank logs when its
    group is ready: `[shoal rank R pid P] info: group ready: rank R of N, transports: self shm tcp`."""
    import re
    got = {}
    for m in re.finditer(r"group ready: rank (\d+) of \d+, transports:((?: \w+)+)", stderr):
        got[int(m.group(1))] = m.group(2).split()
    return got


def _parse_host(s: str) -> int:
    return int(s[len(PREFIX):]) if s.startswith(PREFIX) else int(s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="create N fake hosts")
    u.add_argument("-n", type=int, default=2)
    sub.add_parser("down", help="remove all fake hosts (idempotent)")
    sub.add_parser("status", help="list fake hosts")
    e = sub.add_parser("exec", help="run a command on a fake host")
    e.add_argument("host", help="index or name (shoal-h0)")
    e.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)

    ok, why = available()
    if not ok:
        print(f"netns_hosts: skipped: {why}", file=sys.stderr)
        return SKIP
    if a.cmd == "up":
        h = FakeHosts(a.n)
        try:
            h.up()
        except PermissionError as e:
            print(f"netns_hosts: skipped: {e}", file=sys.stderr)
            return SKIP
        except RuntimeError as e:
            print(f"netns_hosts: cannot create fake hosts ({e}); skipped", file=sys.stderr)
            return SKIP
        atexit.unregister(h.down)  # the CLI leaves them up until `down`
        for i in range(a.n):
            print(f"{host_name(i)} {host_addr(i)}")
        return 0
    if a.cmd == "down":
        down()
        return 0
    if a.cmd == "status":
        for n in existing_hosts():
            print(f"{n} {host_addr(int(n[len(PREFIX):]))}")
        return 0
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("exec: no command")
    i = _parse_host(a.host)
    if host_name(i) not in existing_hosts():
        print(f"netns_hosts: {host_name(i)} does not exist (run `up` first)", file=sys.stderr)
        return 2
    os.execvp("nsenter", host_argv(i, cmd))


if __name__ == "__main__":
    sys.exit(main())
