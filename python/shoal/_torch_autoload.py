"""Entry point of torch's backend autoload: ``import torch`` registers the backend "shoal".

pyproject.toml declares ``[project.entry-points."torch.backends"] shoal =
"shoal._torch_autoload:load"``; torch (>= 2.5) loads every entry point of the group
``torch.backends`` at the end of ``import torch`` (unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``),
so that processes which never ``import shoal`` -- Ray Train's workers, torchrun scripts -- can
still ``dist.init_process_group("shoal")``.

torch turns any exception raised here into a failure of ``import torch``, so this never raises:
a broken shoal (say, ``shoal._C`` built against another torch) only warns. It lives in its own
module rather than in :mod:`shoal.torch` because an exception while *importing* the entry point's
module would break ``import torch`` just the same. Importing ``shoal`` during ``import torch``
registers only the torch backend (the Ray part waits for an explicit ``import shoal``); when it is
``import shoal`` that imports torch, this returns at once and shoal.torch registers the backend.
"""

from __future__ import annotations


def load() -> None:
    import sys

    for name in ("shoal", "shoal.torch"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(getattr(mod, "__spec__", None), "_initializing", False):
            # `import shoal` is what imported torch: shoal.torch registers the backend once the
            # import finishes; registering from here would be a circular import.
            return
    try:
        from .torch import register

        register()
    except Exception as e:  # noqa: BLE001 - never break `import torch`
        import warnings

        warnings.warn(
            f"shoal: could not register the torch.distributed backend 'shoal' during import torch "
            f"({type(e).__name__}: {e}); set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to skip this",
            RuntimeWarning,
            stacklevel=2,
        )
