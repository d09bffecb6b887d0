"""shoal as a ``ray.util.collective`` backend: :class:`ShoalGroup`.

Each group is one shoal communicator (the C++ ``shoal._C.BackendShoal``) among the group's
processes; numpy arrays are wrapped as torch tensors without a copy, so results land in the
caller's array. Rendezvous goes through Ray: rank 0 starts a torch ``TCPStore`` on its node and
publishes its address in Ray's internal KV under the group's name; the others read it there.
The user passes no address or port.

Semantics follow Ray's GLOO backend (``TorchGLOOGroup``) where that one is right:
``reduce`` leaves the input of non-root ranks untouched; ``reducescatter`` does not modify the
input list (GLOO's all-reduces every entry in place, a side effect we do not copy).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
import uuid
import warnings
from typing import Any, List, Optional

import numpy as np

try:
    import torch
    import torch.distributed as dist
except ImportError as _e:  # numpy-only Ray users: say what is missing, not just the module name
    raise ImportError(
        "shoal's Ray collective backend needs torch: it runs on shoal's torch.distributed backend "
        f"(shoal._C, built against torch), also for numpy arrays ({_e}); install torch in the "
        "environment of the driver and of every actor (pip install torch), or use backend='gloo'"
    ) from _e
from ray.util.collective.collective_group.base_collective_group import BaseGroup
from ray.util.collective.types import (
    AllGatherOptions,
    AllReduceOptions,
    BarrierOptions,
    BroadcastOptions,
    RecvOptions,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    SendOptions,
)

from .. import _C

# What Ray's collective calls take: a tensor or NumPy array, or a list of them (one per device).
Tensors = Any

BACKEND = "SHOAL"

_REDUCE_OPS = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
}


def _waited(o, bounded: bool):
    """`o` for a call whose Work this rank waits for at once, within a timeout if `bounded`.
    Without a timeout, asyncOp False: shoal's backend runs the op on this thread before the call
    returns. A wait with a timeout cannot run the op (it could not stop at its deadline): asyncOp
    True starts it on the group's progress thread at once, and the wait is bounded. (torch's
    options objects default to asyncOp True; BENCHMARKS.md, "Ray's collectives ran as async ops".)"""
    o.asyncOp = bounded
    return o


def _allreduce_options(op: dist.ReduceOp, bounded: bool) -> dist.AllreduceOptions:
    o = _waited(dist.AllreduceOptions(), bounded)
    o.reduceOp = op
    return o


# Made once: building options objects is a visible part of a small allreduce's cost.
_ALLREDUCE_OPTIONS = {(op, b): _allreduce_options(op, b) for op in _REDUCE_OPS.values() for b in (False, True)}
_BARRIER_OPTIONS = {b: _waited(dist.BarrierOptions(), b) for b in (False, True)}
_ALLGATHER_OPTIONS = {b: _waited(dist.distributed_c10d.AllgatherOptions(), b) for b in (False, True)}
# What the backend's blocking allreduce takes (converting torch's enum value costs ~1 us a call).
_INLINE_OPS = {op: dist.ReduceOp(op) for op in _REDUCE_OPS.values()}


def default_timeout_s() -> float:
    """Deadline of every op and of the rendezvous: SHOAL_TIMEOUT (seconds) or the core's 300 s."""
    v = os.environ.get("SHOAL_TIMEOUT", "")
    if not v:
        return 300.0
    try:
        s = float(v)
    except ValueError:
        s = float("nan")
    if not 0.001 <= s <= 1e9:  # as the core reads it (NaN and inf fail too)
        raise ValueError(f"SHOAL_TIMEOUT='{v}': expected seconds from 0.001 to 1000000000")
    return s


def rendezvous_key(group_name: str) -> str:
    return f"shoal/rendezvous/{group_name}"


def _kv():
    import ray.experimental.internal_kv as internal_kv

    return internal_kv


def _form_store(group_name: str, rank: int, world_size: int, timeout_s: float) -> dist.Store:
    """The group's TCPStore: served by rank 0, found by the others through Ray's KV."""
    import ray

    kv = _kv()
    key = rendezvous_key(group_name)
    deadline = time.monotonic() + timeout_s
    if rank == 0:
        host = ray.util.get_node_ip_address()
        store = dist.TCPStore(host, 0, world_size, True, datetime.timedelta(seconds=timeout_s),
                              wait_for_workers=False)
        # The nonce tells a re-created group's ranks apart from a stale entry.
        kv._internal_kv_put(key, f"{host}:{store.port}:{uuid.uuid4().hex}", overwrite=True)
        return store
    while True:
        value = kv._internal_kv_get(key)
        if value is not None:
            host, port, _nonce = value.decode().rsplit(":", 2)
            try:
                # A bounded connect: a stale entry (rank 0 of an earlier group died before
                # deleting it) fails it and we read the key again. Not too short: rank 0 may be
                # slow to answer while many ranks share few cores.
                store = dist.TCPStore(host, int(port), world_size, False,
                                      datetime.timedelta(seconds=min(30.0, timeout_s)))
                store.set_timeout(datetime.timedelta(seconds=timeout_s))
                return store
            except (RuntimeError, dist.DistStoreError):
                if time.monotonic() > deadline:
                    raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"shoal: rank {rank} of Ray collective group {group_name!r} found no "
                               f"rank 0 within {timeout_s:.0f} s (is every rank initialising the group?)")
        time.sleep(0.02)


try:
    from numpy.lib.array_utils import byte_bounds as _byte_bounds  # NumPy >= 2
except ImportError:  # NumPy 1
    _byte_bounds = np.byte_bounds

_warned_read_only = False


def _root_owner(x: np.ndarray) -> Any:
    """The object that owns an array's memory (the end of its chain of bases)."""
    base: Any = x
    while True:
        if isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        elif isinstance(base, memoryview):
            base = base.obj
        else:
            return base


def _writable_mapping(addr: int, nbytes: int) -> bool:
    """Whether [addr, addr + nbytes) lies in mappings this process may write (/proc/self/maps)."""
    end, at = addr + nbytes, addr
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                span, perms = line.split(None, 2)[:2]
                lo, hi = (int(v, 16) for v in span.split("-"))
                if lo <= at < hi:
                    if perms[1] != "w":
                        return False
                    at = hi
                    if at >= end:
                        return True
    except OSError:
        return False
    return at >= end


def _as_tensor(x: Any, what: str, written: bool) -> torch.Tensor:
    """A tensor over `x`'s memory. `written`: the op writes its result there.

    Ray hands numpy arguments to actors marked read-only. An array the op only reads is used as it
    is. One it writes is written, as Ray's GLOO backend does (one warning per process), when its
    memory is writable in fact; otherwise (a bytes object's buffer, a read-only mapping) it is
    refused."""
    if isinstance(x, torch.Tensor):
        return x
    if not isinstance(x, np.ndarray):
        raise TypeError(f"shoal: {what}: expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
    if not x.dtype.isnative:
        raise ValueError(f"shoal: {what}: numpy arrays must be in native byte order, got {x.dtype}")
    if not x.flags.writeable and written:
        owner = _root_owner(x)
        lo, hi = _byte_bounds(x)  # strided views included
        if isinstance(owner, bytes) or (hi > lo and not _writable_mapping(lo, hi - lo)):
            raise ValueError(f"shoal: {what}: the result would go into a read-only numpy array whose memory "
                             f"cannot be written ({type(owner).__name__}); pass a copy (np.array(x))")
        global _warned_read_only
        if not _warned_read_only:
            _warned_read_only = True
            warnings.warn(
                f"shoal: {what}: writing the result into a numpy array marked read-only (Ray passes numpy "
                f"arguments so), as Ray's GLOO backend does. An array that came zero-copy from Ray's object "
                f"store shares its memory with every reader of that object on this node: copy it first "
                f"(np.array(x)) to keep them apart. (Warned once per process.)", stacklevel=4)
    with warnings.catch_warnings():  # torch warns of every non-writable array: the cases are sorted above
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(x)


def _single(tensors: Any, what: str, written: bool) -> torch.Tensor:
    """ray.util.collective passes one tensor as a one-element list."""
    if not isinstance(tensors, (list, tuple)) or len(tensors) != 1:
        raise ValueError(f"shoal: {what}: expected a list of one tensor (several tensors per process "
                         f"are the *_multigpu API, which only NCCL implements)")
    return _as_tensor(tensors[0], what, written)


def _single_list(tensor_lists: Any, what: str, written: bool) -> List[torch.Tensor]:
    if not isinstance(tensor_lists, (list, tuple)) or len(tensor_lists) != 1:
        raise ValueError(f"shoal: {what}: expected a list holding one list of tensors")
    return [_as_tensor(t, what, written) for t in tensor_lists[0]]


class _Destroyed(RuntimeError):
    """An op on a destroyed group (the group is gone on this rank alone: nothing to abort)."""


class _Contiguous:
    """A contiguous stand-in for a tensor (itself when it already is); `done()` copies results back."""

    def __init__(self, t: torch.Tensor):
        self.orig = t
        self.t = t if t.is_contiguous() else t.contiguous()

    def done(self) -> None:
        if self.t is not self.orig:
            self.orig.copy_(self.t)


def _timeout(opts: Any) -> Optional[datetime.timedelta]:
    t = getattr(opts, "timeout_ms", None)
    if isinstance(t, datetime.timedelta) and t.total_seconds() > 0:
        return t
    return None


class ShoalGroup(BaseGroup):
    """A ``ray.util.collective`` group running on shoal (shared memory on one host, TCP across)."""

    def __init__(self, world_size: int, rank: int, group_name: str, timeout_s: Optional[float] = None):
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"shoal: world_size must be a positive int, got {world_size!r}")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"shoal: rank {rank!r} is not in [0, {world_size})")
        super().__init__(world_size, rank, group_name)
        self._timeout_s = default_timeout_s() if timeout_s is None else float(timeout_s)
        self._store = _form_store(group_name, rank, world_size, self._timeout_s)
        prefix = dist.PrefixStore(f"shoal/{group_name}/", self._store)
        self._backend = _C.BackendShoal(prefix, rank, world_size, datetime.timedelta(seconds=self._timeout_s),
                                        group_name=group_name, front="ray")
        if rank == 0:
            # Every rank has connected (the constructor is collective): the entry has served.
            try:
                _kv()._internal_kv_del(rendezvous_key(group_name))
            except Exception:  # noqa: BLE001  the GCS going away must not fail the group
                pass

    # -- BaseGroup ---------------------------------------------------------------------------

    @classmethod
    def backend(cls) -> str:
        return BACKEND

    @classmethod
    def check_backend_availability(cls) -> bool:
        return True

    def destroy_group(self) -> None:
        backend, self._backend = getattr(self, "_backend", None), None
        if backend is not None:
            backend.shutdown()
        self._store = None

    def transports(self) -> List[str]:
        """How this rank reaches each rank: 'self', 'shm' or 'tcp'."""
        return list(self._live().transports())

    def allreduce(self, tensor: Tensors, allreduce_options: AllReduceOptions = AllReduceOptions()) -> None:
        with self._arguments("allreduce"):
            c = _Contiguous(_single(tensor, "allreduce", written=True))
            op = self._op(allreduce_options)
            # Without a timeout of its own, a blocking call on this thread (no Work, no wait):
            # the cheapest way to run it. (A failure of the op itself has aborted the group
            # already, with its own reason, before _arguments sees it.)
            bounded = _timeout(allreduce_options) is not None
            if not bounded and self._live().allreduce_inline(c.t, _INLINE_OPS[op]):
                c.done()
                return
            work = self._live().allreduce([c.t], _ALLREDUCE_OPTIONS[op, bounded])
        self._run(work, allreduce_options)
        c.done()

    def barrier(self, barrier_options: BarrierOptions = BarrierOptions()) -> None:
        bounded = _timeout(barrier_options) is not None
        self._run(self._live().barrier(_BARRIER_OPTIONS[bounded]), barrier_options)

    def reduce(self, tensor: Tensors, reduce_options: ReduceOptions = ReduceOptions()) -> None:
        with self._arguments("reduce"):
            root = self._root(reduce_options, "reduce")
            # The backend only reads a non-root rank's input: it stays as it was.
            c = _Contiguous(_single(tensor, "reduce", written=self._rank == root))
            o = _waited(dist.ReduceOptions(), _timeout(reduce_options) is not None)
            o.reduceOp = self._op(reduce_options)
            o.rootRank = root
            work = self._live().reduce([c.t], o)
        self._run(work, reduce_options)
        if self._rank == root:
            c.done()

    def allgather(self, tensor_list: List[Any], tensor: Tensors,
                  allgather_options: AllGatherOptions = AllGatherOptions()) -> None:
        with self._arguments("allgather"):
            outs = [_Contiguous(t) for t in _single_list(tensor_list, "allgather", written=True)]
            t = _single(tensor, "allgather", written=False).contiguous()
            if len(outs) != self._world_size:
                raise ValueError(f"shoal: allgather: {len(outs)} output tensors for a group of {self._world_size}")
            work = self._live().allgather([[c.t for c in outs]], [t],
                                          _ALLGATHER_OPTIONS[_timeout(allgather_options) is not None])
        self._run(work, allgather_options)
        for c in outs:
            c.done()

    def broadcast(self, tensor: Tensors, broadcast_options: BroadcastOptions = BroadcastOptions()) -> None:
        with self._arguments("broadcast"):
            o = _waited(dist.BroadcastOptions(), _timeout(broadcast_options) is not None)
            o.rootRank = self._root(broadcast_options, "broadcast")
            c = _Contiguous(_single(tensor, "broadcast", written=self._rank != o.rootRank))
            work = self._live().broadcast([c.t], o)
        self._run(work, broadcast_options)
        if self._rank != o.rootRank:
            c.done()

    def reducescatter(self, tensor: Tensors, tensor_list: List[Any],
                      reducescatter_options: ReduceScatterOptions = ReduceScatterOptions()) -> None:
        with self._arguments("reducescatter"):
            c = _Contiguous(_single(tensor, "reducescatter", written=True))
            ins = [t.contiguous() for t in _single_list(tensor_list, "reducescatter", written=False)]
            if len(ins) != self._world_size:
                raise ValueError(f"shoal: reducescatter: {len(ins)} input tensors for a group of {self._world_size}")
            o = _waited(dist.ReduceScatterOptions(), _timeout(reducescatter_options) is not None)
            o.reduceOp = self._op(reducescatter_options)
            work = self._live().reduce_scatter([c.t], [ins], o)
        self._run(work, reducescatter_options)
        c.done()

    def send(self, tensor: Tensors, send_options: SendOptions) -> None:
        with self._arguments("send"):
            t = _single(tensor, "send", written=False)
        self.send_tagged(t, send_options.dst_rank, 0, _timeout(send_options))

    def recv(self, tensor: Tensors, recv_options: RecvOptions) -> None:
        with self._arguments("recv"):
            t = _single(tensor, "recv", written=True)
        # Ray's RecvOptions names its timeout field `unset_timeout_ms` (a typo upstream).
        self.recv_tagged(t, recv_options.src_rank, 0, _timeout(recv_options))

    # -- beyond BaseGroup: tagged point-to-point (the direct transport uses these) -----------

    def send_tagged(self, t: torch.Tensor, dst: int, tag: int,
                    timeout: Optional[datetime.timedelta] = None) -> None:
        with self._arguments("send"):
            self._peer(dst, "send")
            c = _Contiguous(t)
            work = self._live().send([c.t], dst, tag)
        self._wait(work, timeout)

    def recv_tagged(self, t: torch.Tensor, src: int, tag: int,
                    timeout: Optional[datetime.timedelta] = None) -> None:
        with self._arguments("recv"):
            self._peer(src, "recv")
            c = _Contiguous(t)
            work = self._live().recv([c.t], src, tag)
        self._wait(work, timeout)
        c.done()

    # -- helpers -----------------------------------------------------------------------------

    def _live(self):
        if self._backend is None:
            raise _Destroyed(f"shoal: Ray collective group {self._group_name!r} was destroyed")
        return self._backend

    @contextlib.contextmanager
    def _arguments(self, what: str):
        """Where a rank checks its arguments and submits the op: if it refuses them, the group is
        aborted with the reason, so that its peers fail at once naming it instead of waiting for
        this rank until the timeout."""
        try:
            yield
        except _Destroyed:
            raise
        except Exception as e:
            if self._backend is not None:
                self._backend.abort_because(f"rank {self._rank} refused the arguments of its {what}: {e}")
            raise

    def _op(self, opts) -> dist.ReduceOp:
        op = getattr(opts, "reduceOp", ReduceOp.SUM)
        if op not in _REDUCE_OPS:
            raise ValueError(f"shoal: unsupported reduce op {op!r} (SUM, PRODUCT, MIN, MAX)")
        return _REDUCE_OPS[op]

    def _root(self, opts, what: str) -> int:
        root = opts.root_rank
        if not isinstance(root, int) or not 0 <= root < self._world_size:
            raise ValueError(f"shoal: {what}: root rank {root!r} is not in [0, {self._world_size})")
        if getattr(opts, "root_tensor", 0) != 0:
            raise ValueError(f"shoal: {what}: root_tensor must be 0 (one tensor per process)")
        return root

    def _peer(self, peer: int, what: str) -> None:
        if not isinstance(peer, int) or not 0 <= peer < self._world_size:
            raise ValueError(f"shoal: {what}: rank {peer!r} is not in [0, {self._world_size})")
        if peer == self._rank:
            raise ValueError(f"shoal: {what}: rank {peer} is this process")

    def _run(self, work, opts) -> None:
        self._wait(work, _timeout(opts))

    @staticmethod
    def _wait(work, timeout: Optional[datetime.timedelta]) -> None:
        if timeout is None:
            work.wait()
        else:
            work.wait(timeout)
