"""Algorithm profile of shoal in Ray: p2p and allreduce, shoal against Ray's built-in GLOO backend.

    python -m shoal.ray.profile --world 8 --size 8388608 [--sizes 1K,4K,16K] [--trials 20]
        [--warmup 3] [--batch N] [--json FILE] [--address ADDR] [--verify-algos]

Starts ``--world`` actors (``ray.init()`` unless Ray is already initialised; ``--address`` joins
a running cluster) and forms, through the public ``ray.util.collective`` API
(``init_collective_group`` in each actor), one GLOO group and four shoal groups: shoal reads
``SHOAL_ALGO`` once, when a communicator is constructed, so each shoal group is created with
``SHOAL_ALGO`` set in the actor to ``ring``, ``bde``, ``mst`` or unset (``auto``: the core's own
choice, which on one host is the direct shared-memory algorithm). Per size, rows in this order:

    p2p gloo / p2p shoal       rank 0 sends the tensor to rank 1 (``col.send`` / ``col.recv``)
    allreduce gloo             ``col.allreduce`` (SUM) on the GLOO group
    allreduce shoal ring|bde|mst|auto

Each trial, in every actor: refill ``--batch`` buffers with this rank's input, ``col.barrier``
on the group under test, then time ``--batch`` back-to-back calls, one per buffer, with
``time.perf_counter`` (inside the actor: no Ray task overhead; default batch 16 up to 1 MiB, so
that small ops are timed as a loop, as user code calls them, and not only cold after a barrier;
1 above), ``col.barrier`` again (untimed: so that no rank's checking and refilling competes for
the cores with a rank still in the timed calls), then compare every buffer with the numpy
reference, exactly (the inputs are small integers, so every summation order gives the same
float32 result); a wrong result raises.
Warm-up trials run and are checked the same way but not timed. The reported time is the largest
over ranks of each rank's **median** time per call (trial time / batch; p2p: over the two ranks
involved); the JSON also has the means. ``--verify-algos`` attaches gdb to rank 0 afterwards
and shows which ``shoal::algo::allreduce_*`` function each shoal row runs. algbw = bytes / time; busbw = algbw·2(p−1)/p for allreduce, algbw for
p2p. "x gloo" is GLOO's time over the row's time for the same op and size (> 1: faster).

Then, per size, rows timed as the driver of a Ray program sees them (Ray's allreduce-profiling
notebook times them so): no barrier, one ``ray.get`` of every actor's call per trial, the wall
time of that ``ray.get`` in the driver, so that the ranks enter the op as Ray delivers the calls,
spread in time, with Ray's own threads on the same cores:

    ray.get no-op              every actor's call does nothing: Ray's own cost of one round
    ray.get allreduce gloo     every actor's call is one ``col.allreduce`` (a zero buffer while
    ray.get allreduce shoal    timed: repeated sums stay exact), then one checked call

Their time is the median over the trials of the ``ray.get``'s wall time (also min and max);
"x no-op" is the row's time over the no-op row's.

Sizes are counts of float32 elements; ``K`` and ``M`` suffixes are binary (1K = 1024).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from typing import Any, Dict, List, Optional

ALGOS = ["ring", "bde", "mst", "auto"]
SMALL_BYTES = 64 << 10          # the "small tensors": ≤ 64 KiB
TARGET_LARGE = 5.0              # shoal's allreduce vs GLOO at --size
TARGET_SMALL = 20.0             # ... and at every size ≤ SMALL_BYTES
TARGET_RAY_GET_LARGE = 5.0      # per ray.get of every actor's call: shoal vs GLOO at --size
TARGET_RAY_GET_NOOP = 1.5       # ... and at 64 KiB, time over a no-op call on every actor (at most)
P2P_SRC, P2P_DST = 0, 1
_UNITS = {"": 1, "K": 1 << 10, "KI": 1 << 10, "M": 1 << 20, "MI": 1 << 20, "G": 1 << 30, "GI": 1 << 30}


def parse_count(s: str) -> int:
    """'8388608', '16K', '16Ki', '8M' -> elements (binary suffixes)."""
    t = s.strip().upper()
    num = t.rstrip("KMGI")
    unit = t[len(num):]
    if unit not in _UNITS or not num:
        raise argparse.ArgumentTypeError(f"not a count of elements: {s!r} (e.g. 4096, 16K, 8M)")
    n = int(float(num) * _UNITS[unit])
    if n < 1:
        raise argparse.ArgumentTypeError(f"count must be >= 1: {s!r}")
    return n


def parse_counts(s: str) -> List[int]:
    return [parse_count(x) for x in s.split(",") if x.strip()]


def fmt_bytes(n: int) -> str:
    for u, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m} {u}"
    return f"{n} B"


def rank_input(count: int, rank: int):
    """Rank `rank`'s input: small integers as float32, different on each rank and position."""
    import numpy as np

    i = np.arange(count, dtype=np.int64)
    return ((i * (rank + 1) + 3 * rank) % 31).astype(np.float32)


def allreduce_reference(count: int, world: int):
    import numpy as np

    acc = np.zeros(count, dtype=np.int64)
    for r in range(world):
        i = np.arange(count, dtype=np.int64)
        acc += (i * (r + 1) + 3 * r) % 31
    return acc.astype(np.float32)  # ≤ 30·world: exact in float32


# ---------------------------------------------------------------------------------------------
# The actor (plain class; wrapped with ray.remote by the driver).


class ProfileWorker:
    def __init__(self, rank: int, world: int):
        import torch  # noqa: F401  first: torch's backend autoload then finds shoal not half-imported
        import shoal  # noqa: F401  registers the collective backend "shoal" in this process

        self.rank, self.world = rank, world
        self._cache: Dict[Any, Any] = {}

    def info(self) -> Dict[str, Any]:
        import socket

        return {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname()}

    def init_groups(self, groups: List[List[Optional[str]]]) -> Dict[str, List[str]]:
        """groups: [name, backend, algo or None]; created in this order (every actor the same)."""
        import ray.util.collective as col

        transports = {}
        for name, backend, algo in groups:
            saved = os.environ.get("SHOAL_ALGO")
            try:
                if backend == "shoal":
                    # Read by the C++ communicator in its constructor (putenv reaches getenv).
                    if algo and algo != "auto":
                        os.environ["SHOAL_ALGO"] = algo
                    else:
                        os.environ.pop("SHOAL_ALGO", None)
                col.init_collective_group(self.world, self.rank, backend=backend, group_name=name)
            finally:
                if saved is None:
                    os.environ.pop("SHOAL_ALGO", None)
                else:
                    os.environ["SHOAL_ALGO"] = saved
            if backend == "shoal":
                g = col.get_group_handle(name)
                transports[name] = list(g.transports()) if hasattr(g, "transports") else []
        return transports

    def destroy_groups(self, names: List[str]) -> None:
        import ray.util.collective as col

        for name in names:
            if col.is_group_initialized(name):
                col.destroy_collective_group(name)

    def call_once(self, kind: str, group: str, count: int, check: bool = False) -> bool:
        """One call of the per-ray.get rows: nothing ("noop"), or one allreduce on `group` of a
        zero buffer (checked: of this rank's input, compared with the reference)."""
        import numpy as np
        import ray.util.collective as col

        if kind == "noop":
            return True
        key = ("zeros", count)
        if key not in self._cache:
            self._cache[key] = np.zeros(count, dtype=np.float32)
        buf = self._cache[key]
        if not check:
            col.allreduce(buf, group)
            return True
        mine = self._data(count).copy()
        col.allreduce(mine, group)
        return bool(np.array_equal(mine, self._expected("allreduce", count)))

    def _data(self, count: int):
        key = ("in", count)
        if key not in self._cache:
            self._cache[key] = rank_input(count, self.rank)
        return self._cache[key]

    def _expected(self, kind: str, count: int):
        key = (kind, count)
        if key not in self._cache:
            self._cache[key] = (allreduce_reference(count, self.world) if kind == "allreduce"
                                else rank_input(count, P2P_SRC))
        return self._cache[key]

    def run(self, kind: str, group: str, count: int, trials: int, warmup: int, batch: int = 1) -> Dict[str, Any]:
        """One row: `warmup` + `trials` trials of `batch` back-to-back calls, each call on its own
        buffer, every buffer checked after the trial; the time per call (s) of each timed trial."""
        import numpy as np
        import ray.util.collective as col

        src = self._data(count)
        bufs = [np.empty(count, dtype=np.float32) for _ in range(batch)]
        times: List[float] = []
        role = None
        if kind == "p2p":
            role = "send" if self.rank == P2P_SRC else "recv" if self.rank == P2P_DST else None
        expected = self._expected(kind, count) if (kind == "allreduce" or role == "recv") else None
        checked = 0
        for t in range(warmup + trials):
            for buf in bufs:
                if kind == "allreduce" or role == "send":
                    np.copyto(buf, src)
                else:
                    buf.fill(-1.0)
            col.barrier(group)
            dt = None
            if kind == "allreduce":
                t0 = time.perf_counter()
                for buf in bufs:
                    col.allreduce(buf, group)
                dt = time.perf_counter() - t0
            elif role == "send":
                t0 = time.perf_counter()
                for buf in bufs:
                    col.send(buf, P2P_DST, group)
                dt = time.perf_counter() - t0
            elif role == "recv":
                t0 = time.perf_counter()
                for buf in bufs:
                    col.recv(buf, P2P_SRC, group)
                dt = time.perf_counter() - t0
            # Untimed: no rank checks or refills (the harness's own work) while another is still
            # in the timed calls. With more ranks than cores that work would take the cores from
            # the ranks still returning and be counted in their time
            # (scripts/allreduce_after_work.py --barrier-after shows the effect).
            col.barrier(group)
            if dt is None:
                continue  # not part of this p2p pair: only the barriers
            for k, buf in enumerate(bufs):
                if expected is not None:
                    if not np.array_equal(buf, expected):
                        bad = np.flatnonzero(buf != expected)
                        j = int(bad[0])
                        raise AssertionError(
                            f"shoal.ray.profile: WRONG RESULT: {kind} on group {group!r}, {count} elements, "
                            f"rank {self.rank}, trial {t}, call {k}: {bad.size} elements differ, first at [{j}]: "
                            f"got {buf[j]!r}, expected {expected[j]!r}")
                    checked += 1
                elif role == "send" and not np.array_equal(buf, src):
                    raise AssertionError(f"shoal.ray.profile: send modified the sender's tensor (group {group!r})")
            if t >= warmup:
                times.append(dt / batch)
        return {"rank": self.rank, "times": times, "checked": checked, "role": role}


# ---------------------------------------------------------------------------------------------
# Driver.


def batch_for(nbytes: int, batch: int = 0) -> int:
    """Calls per trial: `batch`, or 0 = automatic: 16 up to 1 MiB (at most 16 MiB of buffers), 1 above."""
    if batch > 0:
        return batch
    return max(1, min(16, (16 << 20) // nbytes)) if nbytes <= (1 << 20) else 1


def _sig(x: float) -> float:
    return float(f"{x:.6g}")


def _stats(per_rank: List[Dict[str, Any]]) -> Dict[str, Any]:
    timed = [r for r in per_rank if r["times"]]
    med = {r["rank"]: statistics.median(r["times"]) for r in timed}
    mean = {r["rank"]: statistics.fmean(r["times"]) for r in timed}
    return {
        "time_s": max(med.values()),
        "mean_s": max(mean.values()),
        "min_s": min(min(r["times"]) for r in timed),
        "per_rank_median_us": {str(k): round(v * 1e6, 2) for k, v in sorted(med.items())},
        "checked": sum(r["checked"] for r in per_rank),
        "ranks_checked": sorted(r["rank"] for r in per_rank if r["checked"]),
    }


def per_ray_get_rows(actors, names: Dict[str, str], count: int, trials: int, warmup: int,
                     timeout_s: float) -> List[Dict[str, Any]]:
    """The rows timed by the driver, one ``ray.get`` of every actor's call per trial, no barrier."""
    import ray

    world = len(actors)
    rows: List[Dict[str, Any]] = []
    for name, kind, group in (("ray.get no-op", "noop", ""), ("ray.get allreduce gloo", "allreduce", names["gloo"]),
                              ("ray.get allreduce shoal", "allreduce", names["auto"])):
        times = []
        for t in range(warmup + trials):
            t0 = time.perf_counter()
            ray.get([a.call_once.remote(kind, group, count) for a in actors], timeout=timeout_s)
            if t >= warmup:
                times.append(time.perf_counter() - t0)
        ok = ray.get([a.call_once.remote(kind, group, count, True) for a in actors], timeout=timeout_s)
        if not all(ok):
            raise AssertionError(f"shoal.ray.profile: WRONG RESULT: {name}, {count} elements, ranks "
                                 f"{[r for r, x in enumerate(ok) if not x]}")
        t = statistics.median(times)
        nbytes = 4 * count
        algbw = nbytes / t / 1e9 if kind != "noop" else None
        rows.append({"count": count, "bytes": nbytes, "batch": 1, "row": name, "op": f"ray.get {kind}",
                     "backend": "gloo" if "gloo" in name else "shoal" if "shoal" in name else "-", "algo": "auto",
                     "time_us": round(t * 1e6, 2), "mean_us": round(statistics.fmean(times) * 1e6, 2),
                     "min_us": round(min(times) * 1e6, 2), "max_us": round(max(times) * 1e6, 2),
                     "algbw_GBps": _sig(algbw) if algbw else None,
                     "busbw_GBps": _sig(algbw * 2 * (world - 1) / world) if algbw else None,
                     "checked": world if kind != "noop" else 0, "ranks_checked": list(range(world)) if kind != "noop" else []})
    noop, gloo = rows[0]["time_us"], rows[1]["time_us"]
    for r in rows:
        r["speedup_vs_gloo"] = round(gloo / r["time_us"], 3) if r["op"] == "ray.get allreduce" else None
        r["x_noop"] = round(r["time_us"] / noop, 3)
    return rows


def _rows_for(names: Dict[str, str]) -> List[Dict[str, str]]:
    rows = [
        {"row": "p2p gloo", "op": "p2p", "backend": "gloo", "algo": "-", "group": names["gloo"]},
        {"row": "p2p shoal", "op": "p2p", "backend": "shoal", "algo": "auto", "group": names["auto"]},
        {"row": "allreduce gloo", "op": "allreduce", "backend": "gloo", "algo": "-", "group": names["gloo"]},
    ]
    for a in ALGOS:
        rows.append({"row": f"allreduce shoal {a}", "op": "allreduce", "backend": "shoal", "algo": a,
                     "group": names[a]})
    return rows


def profile(world: int = 8, sizes: Optional[List[int]] = None, trials: int = 20, warmup: int = 3,
            address: Optional[str] = None, actor_cpus: float = 1.0, timeout_s: float = 600.0,
            verify: bool = False, batch: int = 0) -> Dict[str, Any]:
    """Runs the profile; returns the results (what --json writes). Raises on a wrong result."""
    import ray

    if world < 2:
        raise ValueError("--world must be at least 2 (p2p needs two ranks)")
    sizes = sizes or [8 << 20]
    started, gdb = False, None
    if not ray.is_initialized():
        kw: Dict[str, Any] = {"include_dashboard": False, "logging_level": "warning"}
        if address:
            kw["address"] = address
        else:
            kw["num_cpus"] = max(int(world * actor_cpus + 0.999), os.cpu_count() or 1)
        ray.init(**kw)
        started = True
    import shoal  # noqa: F401  the driver needs the backend registered too

    run_id = uuid.uuid4().hex[:8]
    names = {"gloo": f"shoal-profile-{run_id}-gloo"}
    names.update({a: f"shoal-profile-{run_id}-{a}" for a in ALGOS})
    groups = [[names["gloo"], "gloo", None]] + [[names[a], "shoal", a] for a in ALGOS]
    Worker = ray.remote(num_cpus=actor_cpus)(ProfileWorker)
    actors = [Worker.remote(r, world) for r in range(world)]
    result: Dict[str, Any] = {
        "world": world, "dtype": "float32", "trials": trials, "warmup": warmup,
        "time": "max over ranks of each rank's median time per call (p2p: ranks 0 and 1)",
        "rows": [],
    }
    try:
        t0 = time.monotonic()
        infos = ray.get([a.info.remote() for a in actors], timeout=timeout_s)
        transports = ray.get([a.init_groups.remote(groups) for a in actors], timeout=timeout_s)
        result["hosts"] = sorted({i["host"] for i in infos})
        result["pids"] = [i["pid"] for i in infos]
        result["transports_rank0"] = sorted(set(t for t in transports[0][names["auto"]] if t != "self"))
        result["setup_s"] = round(time.monotonic() - t0, 2)
        rows = _rows_for(names)
        for count in sizes:
            nbytes = 4 * count
            nbatch = batch_for(nbytes, batch)
            gloo_t: Dict[str, float] = {}
            for spec in rows:
                per_rank = ray.get([a.run.remote(spec["op"], spec["group"], count, trials, warmup, nbatch)
                                    for a in actors], timeout=timeout_s)
                st = _stats(per_rank)
                t = st["time_s"]
                algbw = nbytes / t / 1e9
                busbw = algbw * (2 * (world - 1) / world if spec["op"] == "allreduce" else 1.0)
                if spec["backend"] == "gloo":
                    gloo_t[spec["op"]] = t
                row = {"count": count, "bytes": nbytes, "batch": nbatch, **{k: spec[k] for k in ("row", "op", "backend", "algo")},
                       "time_us": round(t * 1e6, 2), "mean_us": round(st["mean_s"] * 1e6, 2),
                       "min_us": round(st["min_s"] * 1e6, 2),
                       "algbw_GBps": _sig(algbw), "busbw_GBps": _sig(busbw),
                       "speedup_vs_gloo": (round(gloo_t[spec["op"]] / t, 3) if spec["op"] in gloo_t else None),
                       "checked": st["checked"], "ranks_checked": st["ranks_checked"],
                       "per_rank_median_us": st["per_rank_median_us"]}
                result["rows"].append(row)
            result["rows"] += per_ray_get_rows(actors, names, count, trials, warmup, timeout_s)
        result["targets"] = targets(result, sizes[0])
        if verify:
            v, gdb = verify_algorithms(actors, names, min(sizes), timeout_s=min(timeout_s, 300.0))
            result["algorithms_run"] = v
            if "skipped" not in v:
                for a in ALGOS:
                    want = "direct" if a == "auto" and result["transports_rank0"] == ["shm"] else a
                    if a != "auto" and v.get(a) != [want]:
                        raise AssertionError(f"shoal.ray.profile: the {a!r} group ran {v.get(a)} (gdb on rank 0)")
    finally:
        try:
            ray.get([a.destroy_groups.remote(list(names.values())) for a in actors], timeout=60)
        except Exception:  # noqa: BLE001  a failed run: the actors go anyway
            pass
        for a in actors:
            ray.kill(a)
        if gdb is not None:  # rank 0's actor is gone: gdb -batch ends
            try:
                gdb.wait(timeout=60)
            except Exception:  # noqa: BLE001
                gdb.kill()
                gdb.wait()
        if started:
            ray.shutdown()
    return result


_GDB_SCRIPT = """
import gdb
class _Hit(gdb.Breakpoint):
    def stop(self):
        print("SHOAL-HIT " + self.location.rsplit("_", 1)[1], flush=True)
        return False
for _a in ("ring", "bde", "mst", "direct"):
    _Hit("shoal::algo::allreduce_" + _a)
print("SHOAL-ATTACHED", flush=True)
"""


def verify_algorithms(actors, names: Dict[str, str], count: int, timeout_s: float = 180.0):
    """Which allreduce function each shoal group really runs: gdb attaches to rank 0's actor
    with a non-stopping breakpoint on each ``shoal::algo::allreduce_*`` and each group runs one
    checked allreduce in turn. Returns ({algo row: [functions hit]} or {"skipped": why}, the gdb
    process or None). gdb stays attached until the actor ends (the caller kills it, then waits
    for gdb). Needs gdb, ptrace permission and rank 0 on this host."""
    import queue
    import shutil
    import socket
    import subprocess
    import tempfile
    import threading

    import ray

    info = ray.get(actors[0].info.remote())
    if not shutil.which("gdb"):
        return {"skipped": "gdb not found"}, None
    if info["host"] != socket.gethostname():
        return {"skipped": "rank 0 is on another host"}, None
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(_GDB_SCRIPT)
        script = f.name
    gdb = subprocess.Popen(["gdb", "-q", "-nx", "-batch", "-p", str(info["pid"]), "-ex", "set pagination off",
                            "-ex", "set breakpoint pending on", "-x", script, "-ex", "continue"],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    q: "queue.Queue[Optional[str]]" = queue.Queue()

    def pump():
        for x in gdb.stdout:
            q.put(x)
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    try:
        deadline = time.monotonic() + timeout_s  # loading torch's symbols takes a while
        while True:
            try:
                x = q.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                return {"skipped": "gdb did not attach in time"}, gdb
            if x is None:
                return {"skipped": "gdb could not attach (ptrace not allowed?)"}, gdb
            if "SHOAL-ATTACHED" in x:
                break
        time.sleep(1.0)
        hits: Dict[str, List[str]] = {}
        for a in ALGOS:
            ray.get([w.run.remote("allreduce", names[a], count, 1, 0, 1) for w in actors], timeout=timeout_s)
            got = []
            while True:
                try:
                    x = q.get(timeout=1.0)
                except queue.Empty:
                    break
                if x is None:
                    break
                if x.startswith("SHOAL-HIT "):
                    got.append(x.split()[1])
            hits[a] = sorted(set(got))
        return hits, gdb
    finally:
        threading.Timer(5.0, lambda: os.path.exists(script) and os.unlink(script)).start()


def targets(result: Dict[str, Any], main_count: int) -> List[Dict[str, Any]]:
    """The issue's targets, for the automatic choice: ≥5× GLOO at the main size, ≥20× ≤ 64 KiB."""
    out = []
    for r in result["rows"]:
        if r["row"] == "ray.get allreduce shoal":
            if r["count"] == main_count:
                out.append({"row": r["row"], "count": r["count"], "bytes": r["bytes"], "need": TARGET_RAY_GET_LARGE,
                            "got": r["speedup_vs_gloo"], "met": r["speedup_vs_gloo"] >= TARGET_RAY_GET_LARGE})
            elif r["bytes"] == SMALL_BYTES:
                out.append({"row": r["row"], "count": r["count"], "bytes": r["bytes"], "need_x_noop": TARGET_RAY_GET_NOOP,
                            "got_x_noop": r["x_noop"], "met": r["x_noop"] <= TARGET_RAY_GET_NOOP})
            continue
        if r["row"] != "allreduce shoal auto":
            continue
        if r["bytes"] <= SMALL_BYTES:
            need = TARGET_SMALL
        elif r["count"] == main_count:
            need = TARGET_LARGE
        else:
            continue
        out.append({"row": r["row"], "count": r["count"], "bytes": r["bytes"], "need": need, "got": r["speedup_vs_gloo"],
                    "met": r["speedup_vs_gloo"] is not None and r["speedup_vs_gloo"] >= need})
    return out


def format_table(result: Dict[str, Any]) -> str:
    lines = [f"shoal.ray.profile: {result['world']} actors on {len(result.get('hosts', []))} host(s), float32, "
             f"{result['trials']} trials + {result['warmup']} warm-up per row, shoal transport: "
             f"{','.join(result.get('transports_rank0', [])) or '?'}",
             f"time = {result['time']}; busbw = algbw*2(p-1)/p (allreduce), algbw (p2p); "
             f"x gloo = gloo time / row time; check = calls x ranks compared with numpy, all exact"]
    hdr = f"{'row':<24}{'time us':>12}{'mean us':>12}{'algbw GB/s':>12}{'busbw GB/s':>12}{'x gloo':>9}{'check':>8}"
    hdr_get = f"{'row':<24}{'time us':>12}{'min us':>12}{'max us':>12}{'x no-op':>12}{'x gloo':>9}{'check':>8}"
    last = None
    for r in result["rows"]:
        per_get = r["op"].startswith("ray.get")
        if (r["count"], per_get) != last:
            last = (r["count"], per_get)
            what = ("timed in the driver, one ray.get of every actor's call per trial, no barrier" if per_get
                    else f"{r['batch']} call(s) per trial")
            lines += ["", f"size {r['count']} elements ({fmt_bytes(r['bytes'])}), {what}", hdr_get if per_get else hdr]
        x = "-" if r["speedup_vs_gloo"] is None or r["backend"] == "gloo" else f"{r['speedup_vs_gloo']:.2f}"
        check = "ok " + str(r["checked"]) if r["checked"] else "-"
        if per_get:
            lines.append(f"{r['row']:<24}{r['time_us']:>12.1f}{r['min_us']:>12.1f}{r['max_us']:>12.1f}"
                         f"{r['x_noop']:>12.2f}{x:>9}{check:>8}")
        else:
            lines.append(f"{r['row']:<24}{r['time_us']:>12.1f}{r['mean_us']:>12.1f}{r['algbw_GBps']:>12.3f}"
                         f"{r['busbw_GBps']:>12.3f}{x:>9}{check:>8}")
    v = result.get("algorithms_run")
    if v:
        lines.append("")
        if "skipped" in v:
            lines.append(f"algorithms run (gdb on rank 0): not checked: {v['skipped']}")
        else:
            lines.append("algorithms run (gdb on rank 0, shoal::algo::allreduce_*): " +
                         ", ".join(f"{a} -> {'+'.join(v.get(a) or ['?'])}" for a in ALGOS))
    tg = result.get("targets") or []
    if tg:
        lines.append("")
        for t in tg:
            if "need_x_noop" in t:
                lines.append(f"target: {t['row']} at {fmt_bytes(t['bytes'])}: <= {t['need_x_noop']:g}x a no-op call, "
                             f"got {t['got_x_noop']:.2f}x: {'met' if t['met'] else 'NOT MET'}")
            else:
                lines.append(f"target: {t['row']} at {fmt_bytes(t['bytes'])}: >= {t['need']:g}x gloo, "
                             f"got {t['got']:.2f}x: {'met' if t['met'] else 'NOT MET'}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shoal.ray.profile", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=8, help="actors (ranks), >= 2 (default 8)")
    p.add_argument("--size", type=parse_count, default=8 << 20,
                   help="float32 elements of the main rows (default 8M = 2^23, 32 MiB)")
    p.add_argument("--sizes", type=parse_counts, default=parse_counts("1K,4K,16K"),
                   help="more sizes, comma-separated elements (default 1K,4K,16K = 4..64 KiB; '' for none)")
    p.add_argument("--trials", type=int, default=20, help="timed calls per row and size (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed (still checked) calls first (default 3)")
    p.add_argument("--batch", type=int, default=0,
                   help="calls per trial, back to back, each on its own buffer (default 0 = 16 up to 1 MiB, "
                        "else 1)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--address", help="join this Ray cluster (default: the running one, or start a local one)")
    p.add_argument("--actor-cpus", type=float, default=1.0, help="num_cpus of each actor (default 1)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for each step (default 600)")
    p.add_argument("--verify-algos", action="store_true",
                   help="after timing, attach gdb to rank 0 and show which shoal::algo::allreduce_* each "
                        "shoal row runs (fails if ring/bde/mst run anything else)")
    a = p.parse_args(argv)
    if a.trials < 1 or a.warmup < 0 or a.batch < 0:
        p.error("--trials must be >= 1, --warmup and --batch >= 0")
    if a.world < 2:
        p.error("--world must be at least 2 (p2p needs two ranks)")
    sizes = [a.size] + [s for s in a.sizes if s != a.size]
    result = profile(world=a.world, sizes=sizes, trials=a.trials, warmup=a.warmup, address=a.address,
                     actor_cpus=a.actor_cpus, timeout_s=a.timeout, verify=a.verify_algos,
                     batch=a.batch)
    print(format_table(result), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
