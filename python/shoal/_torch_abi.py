"""The torch that shoal._C was built against, and the refusal of any other.

The extension uses c10d's C++ ABI, which changes between torch releases: loaded into another
torch it fails on a missing symbol at best and crashes at worst. CMake records the torch of the
build in ``shoal/_build_info.py``; ``check()`` runs before ``shoal._C`` is imported.
"""

from __future__ import annotations


class TorchVersionError(ImportError):
    """The installed torch is not the release shoal._C was built against."""


def release(version: str) -> str:
    """'2.13.0+cpu' -> '2.13.0': CPU and CUDA builds of one torch release share its C++ API."""
    return version.split("+", 1)[0]


def check(installed: str) -> None:
    from ._build_info import TORCH_VERSION as built

    if release(installed) != release(built):
        raise TorchVersionError(
            f"shoal was built against torch {built} but torch {installed} is installed; rebuild shoal "
            "against it: pip install --no-build-isolation --force-reinstall <shoal source>"
        )
