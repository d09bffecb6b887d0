"""A group of Ray actors that form one ``torch.distributed`` process group: :class:`WorkerGroup`.

    from shoal.ray import WorkerGroup

    def step(x):
        import torch, torch.distributed as dist
        t = torch.tensor([x * (dist.get_rank() + 1.0)])
        dist.all_reduce(t)
        return t.item()

    with WorkerGroup(4, resources_per_worker={"CPU": 1}) as wg:   # backend="shoal"
        print(wg.execute(step, 2.0))                               # [20.0, 20.0, 20.0, 20.0]

What it does, as Ray Train's worker group does:

- reserves one placement-group bundle per worker (strategy ``PACK``) and starts one actor in
  each; every actor imports shoal, so the backend "shoal" is registered there;
- orders the workers by node (the driver's node first), then by lowest GPU id, and gives each its
  rank, local rank, local world size and node rank -- as :func:`get_context` in the worker and as
  the environment variables ``RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE NODE_RANK MASTER_ADDR
  MASTER_PORT``; workers on one node get consecutive ranks;
- when the workers ask for GPUs, sets ``CUDA_VISIBLE_DEVICES`` of every worker to all the GPUs
  given to the group's workers on its node (so that they can reach each other's devices), and
  picks the worker's own device (:attr:`WorkerContext.device`);
- calls ``init_process_group(backend, init_method="env://")`` in every worker, the rendezvous at
  rank 0's node (``backend=None``: no process group);
- :meth:`WorkerGroup.execute` runs a function on every worker and returns the results in rank order.

One failure ends the group: when a worker raises inside ``execute``/``execute_single`` or its
process dies, the driver kills every actor of the group (the others may be blocked in a
collective waiting for it) and raises :class:`WorkerGroupError` naming the rank. ``execute_async``
returns the ``ObjectRef`` s and leaves failures to the caller.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

__all__ = ["WorkerGroup", "WorkerGroupError", "WorkerContext", "WorkerInfo", "get_context"]

# After the first failure, how long to wait for the other workers' results before killing them:
# a worker that died is the root cause that the driver should name, and the peers blocked on it
# often fail a moment later (or the death is reported a moment after a peer's error).
_FAILURE_GRACE_S = 2.0


class WorkerGroupError(RuntimeError):
    """A worker of a :class:`WorkerGroup` raised or died; the group has been shut down.

    ``rank`` is the worker named as the cause (a worker that died before one that raised), ``cause``
    its exception (``ray.exceptions.RayTaskError`` wrapping the function's exception, or
    ``ray.exceptions.ActorDiedError``), ``failures`` every rank's exception seen."""

    def __init__(self, message: str, rank: int, cause: BaseException, failures: Dict[int, BaseException]):
        super().__init__(message)
        self.rank = rank
        self.cause = cause
        self.failures = failures


@dataclass(frozen=True)
class WorkerContext:
    """What a worker knows about its place in the group (``get_context()`` in the worker)."""

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    backend: Optional[str]
    device: str = "cpu"  # "cuda:i" when the worker has a GPU and torch sees CUDA


@dataclass
class WorkerInfo:
    """The driver's record of one worker (``WorkerGroup.workers``, in rank order)."""

    rank: int
    local_rank: int
    local_world_size: int
    node_rank: int
    node_id: str
    node_ip: str
    hostname: str
    pid: int
    gpu_ids: List[str] = field(default_factory=list)
    cuda_visible_devices: Optional[str] = None
    device: str = "cpu"


_context: Optional[WorkerContext] = None


def get_context() -> WorkerContext:
    """The calling worker's :class:`WorkerContext`; only inside a function run by a WorkerGroup."""
    if _context is None:
        raise RuntimeError("shoal.ray.worker_group.get_context() is only available inside a WorkerGroup worker")
    return _context


class _Worker:
    """The actor: it imports shoal (registering the backends), then runs what the driver sends."""

    def __init__(self):
        import shoal  # noqa: F401  registers the torch.distributed backend "shoal"

    def metadata(self) -> dict:
        ctx = ray.get_runtime_context()
        return {
            "node_id": ctx.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "gpu_ids": [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])],
        }

    def address_and_port(self):
        addr = ray.util.get_node_ip_address()
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return addr, port

    def setup(self, env: Dict[str, str], ctx: WorkerContext, own_gpu_ids: List[str]) -> str:
        """Sets the environment and the context; returns the worker's device."""
        global _context
        os.environ.update(env)
        device = "cpu"
        if own_gpu_ids:
            try:
                import torch

                if torch.cuda.is_available():
                    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
                    index = visible.index(own_gpu_ids[0]) if own_gpu_ids[0] in visible else 0
                    torch.cuda.set_device(index)
                    device = f"cuda:{index}"
            except ImportError:
                pass
        _context = WorkerContext(**{**ctx.__dict__, "device": device})
        return device

    def init_process_group(self, backend: str, timeout_s: float) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        dist.init_process_group(
            backend=backend,
            init_method="env://",
            rank=_context.world_rank,
            world_size=_context.world_size,
            timeout=timedelta(seconds=timeout_s),
        )

    def destroy_process_group(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    def execute(self, fn: Callable, args, kwargs):
        return fn(*args, **kwargs)


def _check_backend(backend: Optional[str]) -> None:
    """Raises ValueError unless every backend named in `backend` ("shoal", "gloo",
    "cpu:shoal,cuda:nccl") is one torch.distributed knows in the driver."""
    if backend is None:
        return
    import torch.distributed as dist

    import shoal  # noqa: F401  registers "shoal" in the driver too

    known = set(dist.Backend.backend_list)
    if not isinstance(backend, str) or not backend:
        raise ValueError(f"shoal.ray.WorkerGroup: backend must be a string, got {backend!r}")
    names = [item.split(":", 1)[1] if ":" in item else item for item in backend.lower().split(",")]
    bad = [n for n in names if n not in known or n == "undefined"]
    if bad:
        valid = sorted(k for k in known if k != "undefined")
        raise ValueError(
            f"shoal.ray.WorkerGroup: unknown torch.distributed backend {backend!r}; "
            f"valid: {', '.join(valid)}, a 'device:backend,...' list of them, or None for no process group"
        )


def _resource_options(resources: Dict[str, float]) -> dict:
    opts: dict = {"num_cpus": 0, "num_gpus": 0}
    custom = {}
    for k, v in resources.items():
        if k == "CPU":
            opts["num_cpus"] = v
        elif k == "GPU":
            opts["num_gpus"] = v
        elif k == "memory":
            opts["memory"] = v
        else:
            custom[k] = v
    if custom:
        opts["resources"] = custom
    return opts


class WorkerGroup:
    """``num_workers`` Ray actors forming one torch.distributed process group (see the module doc).

    Args:
        num_workers: how many workers (actors).
        resources_per_worker: Ray resources of each worker, e.g. ``{"CPU": 2, "GPU": 1}``
            (default ``{"CPU": 1}``).
        backend: the torch.distributed backend: ``"shoal"`` (default), ``"gloo"``, ``"nccl"``, a
            ``"cpu:shoal,cuda:nccl"`` list, or None for no process group.
        timeout_s: the process group's timeout (``init_process_group(timeout=...)``).
        start_timeout_s: how long to wait for the workers to be placed and the group to form.
        env: extra environment variables of the workers (set before they start).
        placement_strategy: of the placement group, as in Ray Train (``"PACK"``, ``"SPREAD"``, ...).
    """

    def __init__(
        self,
        num_workers: int,
        resources_per_worker: Optional[Dict[str, float]] = None,
        backend: Optional[str] = "shoal",
        timeout_s: float = 1800,
        start_timeout_s: float = 120,
        env: Optional[Dict[str, str]] = None,
        placement_strategy: str = "PACK",
    ):
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"shoal.ray.WorkerGroup: num_workers must be a positive int, got {num_workers!r}")
        _check_backend(backend)
        resources = dict(resources_per_worker) if resources_per_worker else {"CPU": 1}
        if any(v < 0 for v in resources.values()):
            raise ValueError(f"shoal.ray.WorkerGroup: negative resource in {resources!r}")
        if not ray.is_initialized():
            ray.init()
        self.backend = backend
        self.resources_per_worker = resources
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._shut_down = False
        self._pg_initialized = False
        self._actors: List[Any] = []
        self.workers: List[WorkerInfo] = []
        self._pg = placement_group([{k: v for k, v in resources.items() if v > 0} or {"CPU": 0.001}] * num_workers,
                                   strategy=placement_strategy)
        try:
            self._start(num_workers, env, start_timeout_s)
        except BaseException:
            self.shutdown(graceful=False)
            raise

    # -- start ------------------------------------------------------------------------------------

    def _start(self, n: int, env: Optional[Dict[str, str]], start_timeout_s: float) -> None:
        deadline = time.monotonic() + start_timeout_s
        try:
            ray.get(self._pg.ready(), timeout=start_timeout_s)
        except GetTimeoutError:
            raise TimeoutError(
                f"shoal.ray.WorkerGroup: could not place {n} workers with {self.resources_per_worker} each "
                f"within {start_timeout_s:g} s (cluster resources: {ray.cluster_resources()})"
            ) from None
        opts = _resource_options(self.resources_per_worker)
        if env:
            opts["runtime_env"] = {"env_vars": {str(k): str(v) for k, v in env.items()}}
        cls = ray.remote(_Worker)
        actors = [
            cls.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=self._pg, placement_group_bundle_index=i),
                **opts,
            ).remote()
            for i in range(n)
        ]
        self._actors = actors  # creation order, until the ranks are known
        metas = self._gather([a.metadata.remote() for a in actors], "start", deadline)

        # Order: by node (the driver's node first, then in order of appearance), then lowest GPU id.
        driver_node = ray.get_runtime_context().get_node_id()
        node_order: List[str] = [driver_node] if any(m["node_id"] == driver_node for m in metas) else []
        for m in metas:
            if m["node_id"] not in node_order:
                node_order.append(m["node_id"])

        def lowest_gpu(m):
            try:
                return min((int(g) for g in m["gpu_ids"]), default=-1)
            except ValueError:
                return -1

        order = sorted(range(n), key=lambda i: (node_order.index(metas[i]["node_id"]), lowest_gpu(metas[i]), i))
        self._actors = [actors[i] for i in order]
        metas = [metas[i] for i in order]
        per_node: Dict[str, List[int]] = {}
        for rank, m in enumerate(metas):
            per_node.setdefault(m["node_id"], []).append(rank)
        used_nodes = [nid for nid in node_order if nid in per_node]
        share_gpus = self.resources_per_worker.get("GPU", 0) > 0
        node_gpus = {
            nid: ",".join(sorted({g for r in ranks for g in metas[r]["gpu_ids"]}, key=lambda g: (len(g), g)))
            for nid, ranks in per_node.items()
        }
        self.workers = []
        for rank, m in enumerate(metas):
            peers = per_node[m["node_id"]]
            self.workers.append(
                WorkerInfo(
                    rank=rank,
                    local_rank=peers.index(rank),
                    local_world_size=len(peers),
                    node_rank=used_nodes.index(m["node_id"]),
                    node_id=m["node_id"],
                    node_ip=m["node_ip"],
                    hostname=m["hostname"],
                    pid=m["pid"],
                    gpu_ids=m["gpu_ids"],
                    cuda_visible_devices=node_gpus[m["node_id"]] if share_gpus else None,
                )
            )

        master_addr, master_port = self._gather([self._actors[0].address_and_port.remote()], "start", deadline, ranks=[0])[0]
        refs = []
        for w, actor in zip(self.workers, self._actors):
            wenv = {
                "RANK": str(w.rank),
                "WORLD_SIZE": str(n),
                "LOCAL_RANK": str(w.local_rank),
                "LOCAL_WORLD_SIZE": str(w.local_world_size),
                "NODE_RANK": str(w.node_rank),
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
            }
            if w.cuda_visible_devices is not None:
                wenv["CUDA_VISIBLE_DEVICES"] = w.cuda_visible_devices
            ctx = WorkerContext(w.rank, n, w.local_rank, w.local_world_size, w.node_rank, self.backend)
            refs.append(actor.setup.remote(wenv, ctx, w.gpu_ids))
        for w, device in zip(self.workers, self._gather(refs, "start", deadline)):
            w.device = device
        if self.backend is not None:
            self._gather(
                [a.init_process_group.remote(self.backend, self.timeout_s) for a in self._actors],
                f"init_process_group({self.backend!r})",
                deadline,
            )
            self._pg_initialized = True

    # -- running ----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._actors)

    @property
    def actors(self) -> list:
        """The actor handles, in rank order."""
        return list(self._actors)

    def _check_alive(self) -> None:
        if self._shut_down:
            raise RuntimeError("shoal.ray.WorkerGroup: the group has been shut down")

    def execute_async(self, fn: Callable, *args: Any, **kwargs: Any) -> list:
        """Starts ``fn(*args, **kwargs)`` on every worker; returns their ObjectRefs in rank order.
        Failures are the caller's to handle (``ray.get`` raises; the group stays up)."""
        self._check_alive()
        return [a.execute.remote(fn, args, kwargs) for a in self._actors]

    def execute_single_async(self, rank: int, fn: Callable, *args: Any, **kwargs: Any) -> "ray.ObjectRef":
        self._check_alive()
        return self._actors[rank].execute.remote(fn, args, kwargs)

    def execute(self, fn: Callable, *args: Any, **kwargs: Any) -> list:
        """Runs ``fn(*args, **kwargs)`` on every worker; returns the results in rank order. If a
        worker raises or dies, shuts the group down and raises :class:`WorkerGroupError`."""
        return self._gather(self.execute_async(fn, *args, **kwargs), _name(fn))

    def execute_single(self, rank: int, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Runs ``fn(*args, **kwargs)`` on the worker of `rank`; as :meth:`execute`."""
        if not 0 <= rank < len(self._actors):
            raise IndexError(f"shoal.ray.WorkerGroup: rank {rank} out of range (world size {len(self._actors)})")
        return self._gather([self.execute_single_async(rank, fn, *args, **kwargs)], _name(fn), ranks=[rank])[0]

    def _gather(self, refs: list, what: str, deadline: Optional[float] = None, ranks: Optional[List[int]] = None) -> list:
        """ray.get of `refs` (one per rank in `ranks`, default all) that stops at the first failure:
        then it collects what else fails within a grace period, kills the group and raises."""
        ranks = list(range(len(refs))) if ranks is None else ranks
        rank_of = {ref: r for ref, r in zip(refs, ranks)}
        results: Dict[int, Any] = {}
        failures: Dict[int, BaseException] = {}
        pending = list(refs)
        grace_until = None
        while pending:
            now = time.monotonic()
            timeout = None
            if grace_until is not None:
                timeout = max(0.0, grace_until - now)
            if deadline is not None:
                timeout = max(0.0, deadline - now) if timeout is None else min(timeout, max(0.0, deadline - now))
            ready, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            if not ready:
                if grace_until is not None and time.monotonic() >= grace_until:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    if failures:
                        break
                    missing = sorted(rank_of[r] for r in pending)
                    self.shutdown(graceful=False)
                    raise TimeoutError(
                        f"shoal.ray.WorkerGroup: {what} did not finish on rank(s) {missing} in time; "
                        "the group has been shut down"
                    )
                continue
            for ref in ready:
                try:
                    results[rank_of[ref]] = ray.get(ref)
                except (RayTaskError, RayActorError) as e:
                    failures[rank_of[ref]] = e
                    if grace_until is None:
                        # A death or an exception of the function itself is the root cause: stop
                        # now. A torch.distributed error may be the echo of a peer's death.
                        grace = _FAILURE_GRACE_S if _is_dist_error(e) else 0.0
                        grace_until = time.monotonic() + grace
        if failures:
            self._raise_failure(what, failures)
        return [results[r] for r in ranks]

    def _raise_failure(self, what: str, failures: Dict[int, BaseException]) -> None:
        self.shutdown(graceful=False)
        died = [r for r, e in failures.items() if isinstance(e, RayActorError)]
        rank = min(died) if died else min(failures)
        cause = failures[rank]
        msg = f"shoal.ray.WorkerGroup: {_describe(rank, cause, self._info(rank), what)}"
        others = [r for r in sorted(failures) if r != rank]
        if others:
            msg += "; then " + "; ".join(_describe(r, failures[r], self._info(r), short=True) for r in others)
        msg += ". The group has been shut down."
        raise WorkerGroupError(msg, rank, cause, failures) from cause

    def _info(self, rank: int) -> Optional[WorkerInfo]:
        return self.workers[rank] if rank < len(self.workers) else None

    # -- shutdown ---------------------------------------------------------------------------------

    def shutdown(self, graceful: bool = True, timeout_s: float = 30) -> None:
        """Destroys the process group in every worker (when `graceful` and the workers answer
        within `timeout_s`), kills the actors and frees their placement group. Idempotent."""
        with self._lock:
            if self._shut_down:
                return
            self._shut_down = True
        actors, self._actors = self._actors, []
        if graceful and self._pg_initialized and actors:
            refs = [a.destroy_process_group.remote() for a in actors]
            try:
                ray.get(refs, timeout=timeout_s)
            except Exception:  # noqa: BLE001 - killing them below is the fallback
                pass
        for a in actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        pg, self._pg = getattr(self, "_pg", None), None
        if pg is not None:
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001
                pass

    @property
    def is_shut_down(self) -> bool:
        return self._shut_down

    def __enter__(self) -> "WorkerGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown(graceful=exc[0] is None)

    def __del__(self):
        try:
            if not self._shut_down and ray.is_initialized():
                self.shutdown(graceful=False)
        except Exception:  # noqa: BLE001
            pass

    def __repr__(self) -> str:
        state = "shut down" if self._shut_down else f"{len(self._actors)} workers"
        return f"WorkerGroup({state}, backend={self.backend!r}, resources_per_worker={self.resources_per_worker})"


def _name(fn) -> str:
    return f"execute({getattr(fn, '__qualname__', None) or getattr(fn, '__name__', None) or repr(fn)})"


def _describe(rank: int, e: BaseException, info: Optional[WorkerInfo], what: str = "", short: bool = False) -> str:
    where = f" (pid {info.pid} on {info.node_ip})" if info is not None else ""
    during = f" during {what}" if what else ""
    if isinstance(e, RayActorError):
        return f"rank {rank}{where} died{during}" + ("" if short else f" ({_first_line(e)})")
    if isinstance(e, RayTaskError):
        c = e.cause if getattr(e, "cause", None) is not None else e
        return f"rank {rank}{where} raised {type(c).__name__}{during}: {_first_line(c)}"
    return f"rank {rank}{where} failed{during}: {_first_line(e)}"


def _is_dist_error(e: BaseException) -> bool:
    if not isinstance(e, RayTaskError):
        return False
    try:
        import torch.distributed as dist

        return isinstance(getattr(e, "cause", None), dist.DistError)
    except (ImportError, AttributeError):
        return False


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    line = s.splitlines()[0] if s else type(e).__name__
    return line if len(line) <= 300 else line[:297] + "..."
