"""shoal: collective communication over shared memory and TCP.

``import shoal`` registers the torch.distributed backend ``"shoal"`` when torch is installed, so
that ``torch.distributed.init_process_group("shoal")`` works, and, when ray is installed too, the
Ray collective backend and tensor transport ``"shoal"`` (docs/ray.md). The torch part lives in
:mod:`shoal.torch`, the Ray part in :mod:`shoal.ray`; nothing here imports torch or ray unless it
is installed. (``import torch`` alone registers the torch backend: see ``_shoal_autoload``.)
"""

from __future__ import annotations

import importlib.util

try:
    from ._build_info import VERSION as __version__  # the file VERSION, read at build time
except ImportError:  # the source tree, not an installed wheel
    from importlib.metadata import PackageNotFoundError, version

    try:
        __version__ = version("shoal")
    except PackageNotFoundError:
        __version__ = "unknown"
__all__ = ["__version__", "torch_available", "ray_available"]


def torch_available() -> bool:
    """Whether torch is installed (the torch.distributed backend and the Ray backend need it)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # blocked (None in sys.modules) or a broken install
        return False


def ray_available() -> bool:
    """Whether ray is installed (the Ray backend, transport and worker groups need it)."""
    return importlib.util.find_spec("ray") is not None


if torch_available():
    from ._torch_abi import TorchVersionError as _TorchVersionError

    try:
        from . import torch as _torch_backend  # noqa: F401  (registers the backend)
    except _TorchVersionError:
        raise  # another torch than the one shoal._C was built against: a broken install
    except ImportError as _e:
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


if ray_available():
    _register_ray()  # without torch: a warning that says the Ray backend needs it
