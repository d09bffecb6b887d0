"""The tensor transport "shoal" as registered by ray_hook. Ray pickles the class to each actor and
unpickles it on the actor's `_ray_system` thread: this module imports only what `import ray`
has already loaded."""

from __future__ import annotations

from ray.experimental.rdt.tensor_transport_manager import TensorTransportManager

from .ray_hook import lazy_import

TRANSPORT_NAME = "SHOAL"  # as shoal.ray.transport.TRANSPORT_NAME (Ray upper-cases names)
DEVICES = ["cpu", "cuda"]  # as shoal.ray.transport.DEVICES


class LazyShoalTransport(TensorTransportManager):
    """Stands for shoal.ray.transport.ShoalTensorTransport: making one makes one of those."""

    def __new__(cls, *args, **kwargs):
        return lazy_import("shoal.ray.transport").ShoalTensorTransport(*args, **kwargs)

    # Ray asks the class itself (rdt/util.py); the answers are ShoalTensorTransport's.
    @staticmethod
    def is_one_sided() -> bool:
        return False

    @staticmethod
    def can_abort_transport() -> bool:
        return False
