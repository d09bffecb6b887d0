"""shoal: collective communication over shared memory and TCP.

``import shoal`` registers the torch.distributed backend ``"shoal"`` when torch is installed, so
that ``torch.distributed.init_process_group("shoal")`` works. The torch part lives in
:mod:`shoal.torch`; nothing here imports torch unless it is installed.
"""

from __future__ import annotations

import importlib.util
import sys

__version__ = "0.1.0"
__all__ = ["__version__", "torch_available", "ray_available"]


def torch_available() -> bool:
    """Whether torch is installed (the torch.distributed backend needs it)."""
    return importlib.util.find_spec("torch") is not None


def ray_available() -> bool:
    """Whether ray is installed (the Ray backend, transport and worker groups need it)."""
    return importlib.util.find_spec("ray") is not None


def _torch_is_importing() -> bool:
    """True while `import torch` runs: torch's backend autoload (entry point "torch.backends")
    imports shoal then, and importing Ray from inside it would be slow and circular."""
    t = sys.modules.get("torch")
    return t is not None and bool(getattr(getattr(t, "__spec__", None), "_initializing", False))


if torch_available():
    try:
        from . import torch as _torch_backend  # noqa: F401  (registers the backend)
    except ImportError as _e:  # e.g. a torch other than the one shoal._C was built against
        import warnings

        warnings.warn(
            f"shoal: the torch.distributed backend is unavailable ({_e}); "
            "rebuild shoal against the installed torch (pip install --no-build-isolation .)",
            RuntimeWarning,
            stacklevel=2,
        )

if ray_available() and torch_available() and not _torch_is_importing():
    try:
        from .ray import register as _register_ray

        _register_ray()
    except ImportError as _e:
        import warnings

        warnings.warn(f"shoal: the Ray backend is unavailable ({_e})", RuntimeWarning, stacklevel=2)
