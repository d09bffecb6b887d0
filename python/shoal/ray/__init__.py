"""shoal in Ray: a ``ray.util.collective`` backend, a Ray Direct Transport and worker groups.

``import shoal`` calls :func:`register` wherever ray is installed, so that in the driver and in
every actor that imports shoal::

    import shoal                                   # one line, also inside each actor
    import ray.util.collective as col
    col.init_collective_group(world_size, rank, backend="shoal", group_name="g")

and ``@ray.method(tensor_transport="shoal")`` works once the actors share a group made by
``ray.experimental.collective.create_collective_group(actors, backend="shoal")``.
See docs/ray.md.
"""

from __future__ import annotations

BACKEND_NAME = "shoal"


def register() -> None:
    """Register the collective backend and the tensor transport "shoal" with Ray (idempotent)."""
    from ray.util.collective.backend_registry import _global_registry, register_collective_backend

    from .group import ShoalGroup

    if not _global_registry.is_registered(BACKEND_NAME):
        register_collective_backend(BACKEND_NAME, ShoalGroup)
    try:
        from .transport import register as register_transport
    except ImportError:  # pragma: no cover - the transport module is optional while it is written
        return
    register_transport()


def __getattr__(name: str):
    # WorkerGroup pulls in more of Ray; load it on first use.
    if name == "WorkerGroup":
        from .worker_group import WorkerGroup

        return WorkerGroup
    raise AttributeError(name)


__all__ = ["register", "BACKEND_NAME", "WorkerGroup"]
