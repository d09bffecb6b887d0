"""Entry point of torch's backend autoload: ``import torch`` registers the backend "shoal".

pyproject.toml declares ``[project.entry-points."torch.backends"] shoal =
"_shoal_autoload:load"``; torch (>= 2.5) loads every entry point of the group ``torch.backends``
at the end of ``import torch`` (unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), so that processes
which never ``import shoal`` -- Ray Train's workers, torchrun scripts -- can still
``dist.init_process_group("shoal")``.

This is a package of its own, outside ``shoal``, and registers a creator that imports shoal only
when a "shoal" process group is made: importing the ``shoal`` package from inside ``import torch``
would run its ``__init__`` half-way (no Ray registration; torch half-imported), and a later
``import shoal`` would then be a no-op. torch turns any exception raised here into a failure of
``import torch``, so this never raises: it only warns.
"""

from __future__ import annotations

BACKEND_NAME = "shoal"
DEVICES = ["cpu", "cuda"]  # as shoal.torch.DEVICES


def _create_backend(dist_backend_opts, pg_options=None):
    import shoal.torch

    return shoal.torch._create_backend(dist_backend_opts, pg_options)


def load() -> None:
    import sys

    if "shoal.torch" in sys.modules:
        return  # `import shoal` is what imports torch: shoal.torch registers the backend itself
    try:
        import torch.distributed as dist

        if BACKEND_NAME.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=DEVICES)
    except Exception as e:  # noqa: BLE001 - never break `import torch`
        import warnings

        warnings.warn(
            f"shoal: could not register the torch.distributed backend 'shoal' during import torch "
            f"({type(e).__name__}: {e}); set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to skip this",
            RuntimeWarning,
            stacklevel=2,
        )
