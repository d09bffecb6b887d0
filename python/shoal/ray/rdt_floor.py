"""Benchmark-only Ray tensor transports that move no data: the floor of Ray's RDT machinery.

``python -m shoal.ray.rdt_bench`` runs them beside shoal to show what a Ray Direct Transport
transfer costs when the transport itself costs nothing. Each one carries the tensors' bytes
inside its transport metadata, which Ray passes from the producer to the owner and on to the
consumer's ``__ray_recv__`` task with its other task arguments, so no message of the transport's
own is sent:

* ``NODATA``  (two-sided, as shoal and Ray's GLOO are): Ray runs ``__ray_send__`` on the producer
  (which does nothing here) and ``__ray_recv__`` on the consumer;
* ``NODATA1`` (one-sided, as Ray's NIXL is): Ray runs only ``__ray_recv__``.

So their transfers/s bound what any transport of that kind can reach on the machine, and the gap
between ``NODATA`` and shoal is all that shoal's own send and receive cost. Only for small
tensors: the bytes are pickled into Ray's task arguments (``rdt_bench`` runs these rows up to
:data:`MAX_BYTES`). Not for user code: there is no group, no check of who may read, and every
tensor is copied twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from ray.experimental.rdt.tensor_transport_manager import (
    CommunicatorMetadata,
    TensorTransportManager,
    TensorTransportMetadata,
)

MAX_BYTES = 64 << 10  # rdt_bench runs the floor rows only up to this tensor size


@dataclass
class InlineMetadata(TensorTransportMetadata):
    """The usual shapes and dtypes, plus each tensor's bytes."""

    blobs: List[bytes] = field(default_factory=list)


class _Inline(TensorTransportManager):
    NAME = ""

    def tensor_transport_backend(self) -> str:
        return self.NAME

    @staticmethod
    def can_abort_transport() -> bool:
        return False

    def actor_has_tensor_transport(self, actor) -> bool:
        return True  # nothing to set up

    def extract_tensor_transport_metadata(self, obj_id: str, rdt_object) -> InlineMetadata:
        import torch

        return InlineMetadata(tensor_meta=[(t.shape, t.dtype) for t in rdt_object], tensor_device="cpu",
                              blobs=[t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
                                     for t in rdt_object])

    def get_communicator_metadata(self, src_actor, dst_actor, backend=None) -> CommunicatorMetadata:
        return CommunicatorMetadata()

    def recv_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata,
                              target_buffers=None):
        import torch

        m = tensor_transport_metadata
        return [torch.frombuffer(bytearray(b), dtype=torch.uint8).view(dtype).view(shape) if b
                else torch.empty(shape, dtype=dtype)
                for b, (shape, dtype) in zip(m.blobs, m.tensor_meta)]

    def send_multiple_tensors(self, tensors, tensor_transport_metadata, communicator_metadata) -> None:
        pass  # the bytes are in the metadata

    def garbage_collect(self, obj_id, tensor_transport_meta, tensors) -> None:
        pass

    def abort_transport(self, obj_id, communicator_metadata) -> None:
        pass


class NoDataTwoSided(_Inline):
    NAME = "NODATA"

    @staticmethod
    def is_one_sided() -> bool:
        return False


class NoDataOneSided(_Inline):
    NAME = "NODATA1"

    @staticmethod
    def is_one_sided() -> bool:
        return True


def register() -> None:
    """Register both with Ray in this process (idempotent); before the actors are created."""
    import torch
    from ray.experimental.rdt import util

    for cls in (NoDataTwoSided, NoDataOneSided):
        if cls.NAME not in util.transport_manager_info:
            util.register_tensor_transport(cls.NAME, ["cpu"], cls, torch.Tensor)
