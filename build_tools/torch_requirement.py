"""The wheel's dependencies, with the torch requirement the build found (a scikit-build-core
dynamic-metadata provider: pyproject.toml, tool.scikit-build.metadata.dependencies).

shoal._C uses c10d's C++ ABI, which changes between torch releases, so a wheel works only with
the torch release it was compiled against (shoal._torch_abi checks it at import). Its metadata
asks for exactly that release, as torchvision's does: `torch==2.13.0` for a build against
2.13.0+cpu. The local label (+cpu, +cu128) is left out, so CPU and CUDA builds of the release
both satisfy it. A build from source against another release asks for that one.
"""

from __future__ import annotations


def dynamic_metadata(field: str, settings: dict) -> list[str]:
    if field != "dependencies" or settings:
        raise RuntimeError("torch_requirement provides only `dependencies` and takes no settings")
    import torch

    return [f"torch=={torch.__version__.split('+')[0]}", "numpy"]
