"""shoal: collective communication over shared memory and TCP.

``import shoal`` registers the torch.distributed backend ``"shoal"`` when torch is installed, so
that ``torch.distributed.init_process_group("shoal")`` works. The torch part lives in
:mod:`shoal.torch`; nothing here imports torch unless it is installed.
"""

from __future__ import annotations

import importlib.abc
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

def _register_ray() -> None:
    try:
        from .ray import register

        register()
    except ImportError as e:
        import warnings

        warnings.warn(f"shoal: the Ray backend is unavailable ({e})", RuntimeWarning, stacklevel=3)


class _RegisterRayLater(importlib.abc.MetaPathFinder):
    """Registers shoal with Ray at the first import after Ray's backend registry is loaded.

    Used when shoal is first imported by torch's backend autoload, that is inside `import torch`
    (which Ray's collective module itself may be running): Ray's registry cannot be used from
    there, and a later `import shoal` is a no-op. The finder finds nothing; it only watches
    imports go by until `ray.util.collective.backend_registry` is complete."""

    def find_spec(self, name, path, target=None):
        reg = sys.modules.get("ray.util.collective.backend_registry")
        if reg is not None and not getattr(reg.__spec__, "_initializing", False):
            if self in sys.meta_path:
                sys.meta_path.remove(self)
                _register_ray()
        return None


if ray_available() and torch_available():
    if _torch_is_importing():
        sys.meta_path.insert(0, _RegisterRayLater())
    else:
        _register_ray()
