"""shoal: collective communication over shared memory and TCP.

``import shoal`` registers the torch.distributed backend ``"shoal"`` when torch is installed, so
that ``torch.distributed.init_process_group("shoal")`` works. The torch part lives in
:mod:`shoal.torch`; nothing here imports torch unless it is installed.
"""

from __future__ import annotations

import importlib.util

__version__ = "0.1.0"
__all__ = ["__version__", "torch_available"]


def torch_available() -> bool:
    """Whether torch is installed (the torch.distributed backend needs it)."""
    return importlib.util.find_spec("torch") is not None


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
