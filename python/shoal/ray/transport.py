"""shoal as a Ray Direct Transport: ``@ray.method(tensor_transport="shoal")``.

A two-sided transport like Ray's GLOO/NCCL ones (it subclasses Ray's
``CollectiveTensorTransport``): the owner of a ref finds the one shoal group that holds both the
producer and the consumer (``ray.experimental.collective.create_collective_group(actors,
backend="shoal")``), then Ray runs :meth:`ShoalTensorTransport.send_multiple_tensors` on the
producer and :meth:`~ShoalTensorTransport.recv_multiple_tensors` on the consumer, each on the
actor's ``_ray_system`` concurrency group (one thread per actor, so the transfers of one actor run
one at a time, in the order their owner submitted them).

What goes over the wire, per object (the producer's plan travels in the tensor metadata, so no
extra message is needed):

* tensors with no elements: nothing;
* tensors of fewer than :data:`PACK_MAX_BYTES` bytes, when there are two or more: packed, as raw
  bytes at 16-byte aligned offsets, into one message (one round through the op queue instead of
  one per tensor); the receiver hands out views of its one receive buffer;
* every other tensor: one message of its own bytes, straight from the producer's tensor into
  the consumer's new tensor (shoal's shared-memory ring on one host: two memcpy in all). Large
  CPU receive buffers are reused once freed (see :class:`_BufferPool`).

Every message carries a tag derived from the object id and the message's index. shoal matches
the messages between a pair of ranks in order and checks the tag: two transfers whose sends and
receives were issued in different orders fail with an error naming both ranks instead of handing
one object's bytes to another. (Transfers submitted by one owner run in the same order on both
actors; only refs of one pair passed by different owners at once can meet this error.)

A consumer outside the producer's group fails at once with a message saying so (rather than after
Ray's 60 s fetch timeout); ``ray.get`` of a shoal ref outside its actors raises Ray's ValueError
for two-sided transports, and ``ray.get(ref, _use_object_store=True)`` goes through the object
store, as with Ray's GLOO transport.

Data moves as bytes, so every dtype works (bool, complex, bfloat16, float8 ...). CUDA tensors are
staged through pinned host memory by shoal's torch backend.
"""

from __future__ import annotations

import collections
import datetime
import hashlib
import mmap
import os
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Deque, Dict, List, Optional, Tuple

from ray.experimental.rdt.collective_tensor_transport import (
    CollectiveCommunicatorMetadata,
    CollectiveTensorTransport,
    CollectiveTransportMetadata,
)
from ray.experimental.rdt.tensor_transport_manager import CommunicatorMetadata, TensorTransportMetadata

if TYPE_CHECKING:
    import ray
    import torch

TRANSPORT_NAME = "SHOAL"  # Ray upper-cases transport names; "shoal" in user code is the same
DEVICES = ["cpu", "cuda"]

# Tensors below this many bytes travel packed together in one message: a message costs a round
# through shoal's op queue on both ranks, far more than a memcpy of 64 KiB. (On the 2-core test
# machine, 64 tensors of 1 KiB: ~13 ms per transfer packed, ~19 ms one message each; Ray's own
# task round trips are most of both.)
PACK_MAX_BYTES = 64 * 1024
# CPU receive buffers from this size up come from a pool of reused mappings (see _BufferPool).
POOL_MIN_BYTES = 4 << 20


def _tag(obj_id: str, index: int) -> int:
    """A positive 31-bit tag for message `index` of object `obj_id` (torch's tag is a C int; 0 is
    what untagged sends use)."""
    h = hashlib.blake2b(f"{obj_id}/{index}".encode(), digest_size=4).digest()
    return (int.from_bytes(h, "little") & 0x7FFFFFFF) or 1


def _nbytes(shape, dtype) -> int:
    import torch

    n = 1
    for d in shape:
        n *= int(d)
    return n * torch.empty((), dtype=dtype).element_size() if n else 0


def _plan(tensor_meta) -> List[int]:
    """Indices of the tensors to send packed into one message (the producer decides, with its
    PACK_MAX_BYTES, and the decision travels in the metadata)."""
    packed = [i for i, (shape, dtype) in enumerate(tensor_meta) if 0 < _nbytes(shape, dtype) < PACK_MAX_BYTES]
    return packed if len(packed) > 1 else []  # packing one tensor would only add a copy


_PACK_ALIGN = 16  # every packed tensor starts at a multiple of this (any dtype's element size)


def _layout(tensor_meta, packed: List[int]) -> Tuple[List[int], List[int], int]:
    """(offsets, sizes, total bytes) of the packed tensors in their message."""
    offs, sizes, off = [], [], 0
    for i in packed:
        n = _nbytes(*tensor_meta[i])
        offs.append(off)
        sizes.append(n)
        off = (off + n + _PACK_ALIGN - 1) // _PACK_ALIGN * _PACK_ALIGN
    return offs, sizes, off


def _messages(meta: "ShoalTransportMetadata") -> Tuple[List[int], List[int]]:
    """(packed, single): the tensors of the first message (if any), then those sent one per
    message, in order. Tensors with no elements are in neither."""
    packed = list(meta.packed)
    inpack = set(packed)
    single = [i for i, (shape, dtype) in enumerate(meta.tensor_meta)
              if i not in inpack and _nbytes(shape, dtype) > 0]
    return packed, single


def _as_bytes(t: "torch.Tensor") -> "torch.Tensor":
    """A 1-d uint8 view of a tensor's bytes (of a contiguous copy if it is not contiguous)."""
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8)


@dataclass
class ShoalCommunicatorMetadata(CollectiveCommunicatorMetadata):
    """Ray's collective metadata, or why there is no communicator (see get_communicator_metadata)."""

    error: str = ""


class _BufferPool:
    """Large CPU receive buffers, reused once the tensors made from them are freed.

    A new 400 MB buffer takes ~100,000 page faults on its first write (inside shoal's copy out of
    the ring), and the kernel zeroes every page: that costs 4-5x the copy itself (see
    ``SHOAL_RDT_POOL_BYTES=0 python -m shoal.ray.rdt_bench --sizes 100Mi --transports shoal``).
    So buffers are anonymous mappings (advised to use transparent huge pages: fewer faults when
    one must be made) that return here when the last tensor or view of them is freed: torch holds
    the numpy array the tensor was made from until its storage dies, and a finalizer on that array
    gives the mapping back. Up to ``SHOAL_RDT_POOL_BYTES`` (default 1 GiB) of idle buffers are
    kept; 0 turns the pool off. A received tensor's storage cannot be grown in place (``resize_``).

    No lock: the finalizer may run on any thread, even inside another call here (a garbage
    collection), so the free lists are deques, whose append/pop are atomic under the GIL."""

    def __init__(self):
        self._free: Dict[int, Deque[mmap.mmap]] = {}
        self.reused = 0  # buffers served from the free lists (tests and diagnostics)

    @staticmethod
    def limit() -> int:
        """SHOAL_RDT_POOL_BYTES: bytes with an optional K, M or G, as shoal's other byte settings."""
        v = os.environ.get("SHOAL_RDT_POOL_BYTES", "")
        if not v:
            return 1 << 30
        shift = {"k": 10, "m": 20, "g": 30}.get(v[-1].lower(), 0)
        digits = v[:-1] if shift else v
        if not digits.isdigit():
            raise ValueError(f"SHOAL_RDT_POOL_BYTES='{v}': expected bytes (suffixes K, M, G)")
        return int(digits) << shift

    def tensor(self, nbytes: int) -> "torch.Tensor":
        import numpy as np
        import torch

        mm = None
        free = self._free.get(nbytes)
        if free:
            try:
                mm = free.pop()
                self.reused += 1
            except IndexError:  # emptied by another thread meanwhile
                mm = None
        if mm is None:
            mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            try:
                mm.madvise(mmap.MADV_HUGEPAGE)
            except (OSError, AttributeError):
                pass  # THP off in this kernel: ordinary pages
        arr = np.frombuffer(mm, dtype=np.uint8)
        weakref.finalize(arr, self._give_back, mm)
        return torch.from_numpy(arr)

    def _give_back(self, mm: mmap.mmap) -> None:
        if self.idle_bytes() + len(mm) > self.limit():
            return  # the mapping is unmapped when `mm` goes
        self._free.setdefault(len(mm), collections.deque()).append(mm)

    def idle_bytes(self) -> int:
        return sum(len(m) for q in list(self._free.values()) for m in list(q))


_pool = _BufferPool()


def _empty(shape, dtype, device) -> "torch.Tensor":
    """A receive buffer: large CPU ones come from :class:`_BufferPool`."""
    import torch

    nbytes = _nbytes(shape, dtype)
    if str(device) != "cpu" or nbytes < POOL_MIN_BYTES or _BufferPool.limit() <= 0:
        return torch.empty(shape, dtype=dtype, device=device)
    return _pool.tensor(nbytes).view(dtype).view(shape)


def _timeout() -> Optional[datetime.timedelta]:
    return None  # the group's own deadline (SHOAL_TIMEOUT) applies to every op


@dataclass
class ShoalTransportMetadata(CollectiveTransportMetadata):
    """Ray's collective metadata plus the object's id: Ray does not pass the id to
    ``send_multiple_tensors``, and the sender needs it for the tags."""

    obj_id: str = ""
    packed: Tuple[int, ...] = ()


def _own_metadata(meta: TensorTransportMetadata, comm: CommunicatorMetadata) -> "ShoalTransportMetadata":
    """The transfer's metadata as this transport made it. Ray may hand over its base
    CollectiveTransportMetadata (made without this transport, e.g. by its own tests): then every
    tensor goes in a message of its own, tagged without the object's id on both sides (Ray runs
    an actor's transfers one at a time, so the messages still meet in order)."""
    if not isinstance(comm, CollectiveCommunicatorMetadata):
        raise TypeError(f"shoal: tensor_transport='shoal' needs a CollectiveCommunicatorMetadata, got "
                        f"{type(comm).__name__}")
    if isinstance(meta, ShoalTransportMetadata):
        return meta
    if isinstance(meta, CollectiveTransportMetadata):
        return ShoalTransportMetadata(tensor_meta=meta.tensor_meta, tensor_device=meta.tensor_device)
    raise TypeError(f"shoal: tensor_transport='shoal' needs a CollectiveTransportMetadata, got {type(meta).__name__}")


def _group(name: str):
    from ray.util.collective.collective import get_group_handle

    g = get_group_handle(name)
    if not hasattr(g, "send_tagged"):
        raise RuntimeError(
            f"shoal: the collective group {name!r} is a {type(g).__name__}, not a shoal group: "
            "tensor_transport='shoal' needs ray.experimental.collective.create_collective_group("
            "actors, backend='shoal')")
    return g


class ShoalTensorTransport(CollectiveTensorTransport):
    """Ray Direct Transport over a shoal collective group (see the module's docstring)."""

    def tensor_transport_backend(self) -> str:
        return TRANSPORT_NAME

    @staticmethod
    def is_one_sided() -> bool:
        return False

    @staticmethod
    def can_abort_transport() -> bool:
        # A failed transfer fails its ops on both ranks (peer death, timeout, mismatched tag) and
        # aborts the communicator; Ray then kills the two actors, as for its GLOO transport.
        return False

    def get_communicator_metadata(self, src_actor: "ray.actor.ActorHandle", dst_actor: "ray.actor.ActorHandle",
                                  backend: Optional[str] = None) -> CommunicatorMetadata:
        """The ranks of both actors in their shoal group. Runs on the ref's owner, often in a
        callback thread where an exception would be lost and the consumer would wait for Ray's
        fetch timeout (60 s); so a missing group travels to both actors as an error instead: the
        sender sends nothing and the consumer's task fails at once with this message."""
        try:
            return super().get_communicator_metadata(src_actor, dst_actor, backend or TRANSPORT_NAME)
        except ValueError as e:
            return ShoalCommunicatorMetadata(error=(
                f"shoal: cannot move an object from {src_actor} to {dst_actor} with tensor_transport='shoal': "
                f"{e} Both actors must be in one group made by "
                "ray.experimental.collective.create_collective_group(actors, backend='shoal')."))

    def extract_tensor_transport_metadata(self, obj_id: str, rdt_object: List["torch.Tensor"]) -> TensorTransportMetadata:
        import torch

        for t in rdt_object:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"shoal: tensor_transport='shoal' moves torch tensors, got {type(t).__name__}")
        m = super().extract_tensor_transport_metadata(obj_id, rdt_object)
        return ShoalTransportMetadata(tensor_meta=m.tensor_meta, tensor_device=m.tensor_device, obj_id=obj_id,
                                      packed=tuple(_plan(m.tensor_meta)))

    def send_multiple_tensors(
        self,
        tensors: List["torch.Tensor"],
        tensor_transport_metadata: TensorTransportMetadata,
        communicator_metadata: CommunicatorMetadata,
    ) -> None:
        import torch

        tensor_transport_metadata = _own_metadata(tensor_transport_metadata, communicator_metadata)
        if getattr(communicator_metadata, "error", ""):
            return  # no group: the receiver reports it
        if tensors:
            dev = tensors[0].device.type
            for t in tensors:
                if t.device.type != dev:
                    raise ValueError(f"shoal: all tensors of one object must be on one device type, "
                                     f"got {dev} and {t.device.type}")
        packed, single = _messages(tensor_transport_metadata)
        g = _group(communicator_metadata.communicator_name)
        dst = communicator_metadata.dst_rank
        obj_id = tensor_transport_metadata.obj_id
        msg = 0
        if packed:
            offs, sizes, total = _layout(tensor_transport_metadata.tensor_meta, packed)
            buf = torch.zeros(total, dtype=torch.uint8, device=tensors[packed[0]].device)
            for i, off, n in zip(packed, offs, sizes):
                buf[off:off + n].copy_(_as_bytes(tensors[i]))
            g.send_tagged(buf, dst, _tag(obj_id, msg), _timeout())
            msg += 1
        for i in single:
            g.send_tagged(_as_bytes(tensors[i]), dst, _tag(obj_id, msg), _timeout())
            msg += 1

    def recv_multiple_tensors(
        self,
        obj_id: str,
        tensor_transport_metadata: TensorTransportMetadata,
        communicator_metadata: CommunicatorMetadata,
        target_buffers: Optional[List["torch.Tensor"]] = None,
    ) -> List["torch.Tensor"]:
        import torch

        made_here = isinstance(tensor_transport_metadata, ShoalTransportMetadata)
        tensor_transport_metadata = _own_metadata(tensor_transport_metadata, communicator_metadata)
        if getattr(communicator_metadata, "error", ""):
            raise ValueError(communicator_metadata.error)
        # the id the sender tagged with ("" where Ray's own metadata carried none)
        obj_id = (tensor_transport_metadata.obj_id or obj_id) if made_here else ""
        meta = tensor_transport_metadata.tensor_meta
        device = tensor_transport_metadata.tensor_device or "cpu"
        packed, single = _messages(tensor_transport_metadata)
        g = _group(communicator_metadata.communicator_name)
        src = communicator_metadata.src_rank
        out: List[Optional[torch.Tensor]] = [None] * len(meta)
        msg = 0
        if packed:
            offs, sizes, total = _layout(meta, packed)
            buf = torch.empty(total, dtype=torch.uint8, device=device)
            g.recv_tagged(buf, src, _tag(obj_id, msg), _timeout())
            msg += 1
            for i, off, n in zip(packed, offs, sizes):
                shape, dtype = meta[i]
                out[i] = buf[off:off + n].view(dtype).view(shape)
        for i in single:
            shape, dtype = meta[i]
            t = target_buffers[i] if target_buffers else _empty(shape, dtype, device)
            g.recv_tagged(_as_bytes(t), src, _tag(obj_id, msg), _timeout())
            msg += 1
            out[i] = t
        for i, (shape, dtype) in enumerate(meta):
            if out[i] is None:  # no elements
                out[i] = target_buffers[i] if target_buffers else torch.empty(shape, dtype=dtype, device=device)
        return out

    def garbage_collect(self, obj_id: str, tensor_transport_meta: TensorTransportMetadata,
                        tensors: List["torch.Tensor"]) -> None:
        pass  # nothing registered: the RDT store's reference is the only thing to drop

    def abort_transport(self, obj_id: str, communicator_metadata: CommunicatorMetadata) -> None:
        raise NotImplementedError("shoal: the direct transport cannot abort a transfer (can_abort_transport() is False)")


def register() -> None:
    """Register the tensor transport "shoal" with Ray (idempotent; ``import shoal`` calls it).

    Ray registers transports per process and copies the driver's registrations to each actor
    before its first transfer; registering under a name Ray already has raises, hence the check.
    The class registered is the stand-in ``_shoal_autoload.ray_transport.LazyShoalTransport``
    (making one makes a ShoalTensorTransport): Ray unpickles the class in each actor on its
    ``_ray_system`` thread, and unpickling this module there could race the actor's own
    ``import shoal`` on its task thread (two threads importing one package's parts deadlock)."""
    import torch
    from _shoal_autoload.ray_transport import LazyShoalTransport
    from ray.experimental.rdt import util

    if TRANSPORT_NAME not in util.transport_manager_info:
        try:
            util.register_tensor_transport(TRANSPORT_NAME, DEVICES, LazyShoalTransport, torch.Tensor)
        except ValueError:
            if TRANSPORT_NAME not in util.transport_manager_info:  # not a lost race: a real error
                raise


__all__ = ["ShoalTensorTransport", "register", "TRANSPORT_NAME", "PACK_MAX_BYTES"]
