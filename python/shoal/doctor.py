"""``python -m shoal doctor``: what shoal will do on this machine (docs/doctor.md).

The report of the C++ tool ``shoal-doctor`` (version and build, CPU and kernels, ``/dev/shm``,
single copy, descriptors, network, ``SHOAL_*`` settings; with ``-n N`` a group of N ranks formed
here), and torch's and Ray's side: their versions and whether shoal's torch backend, Ray collective
backend and Ray tensor transport are registered in this process.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import metadata

import shoal


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def python_items() -> list[tuple[str, str, str, bool]]:
    """torch's and Ray's side of the report, as (section, key, value, warning)."""
    items = [
        ("python", "version", sys.version.split()[0], False),
        ("python", "shoal package", f"{shoal.__version__} ({os.path.dirname(shoal.__file__)})", False),
    ]
    torch_version = _version("torch")
    if torch_version is None:
        items.append(("torch", "torch", "not installed: the torch backend and the Ray backend need it", False))
    else:
        import torch.distributed as dist

        items.append(("torch", "version", torch_version, False))
        registered = "shoal" in dist.Backend.backend_list
        items.append(("torch", "backend 'shoal' registered",
                      "yes: init_process_group('shoal') works" if registered
                      else "no: import shoal first (torch's backend autoload is off or failed)", not registered))
        autoload = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") != "0"
        items.append(("torch", "registered by `import torch`",
                      "yes (torch's backend autoload)" if autoload else "no: TORCH_DEVICE_BACKEND_AUTOLOAD=0", False))
    ray_version = _version("ray")
    if ray_version is None:
        items.append(("ray", "ray", "not installed", False))
        return items
    items.append(("ray", "version", ray_version, False))
    try:
        from ray.util.collective.backend_registry import _global_registry

        from shoal.ray import BACKEND_NAME

        ok = _global_registry.is_registered(BACKEND_NAME)
        items.append(("ray", "collective backend 'shoal' registered",
                      "yes: create_collective_group(..., backend='shoal') works" if ok
                      else "no: import shoal in the driver and the actors", not ok))
    except Exception as e:  # noqa: BLE001  (a Ray release with another registry)
        items.append(("ray", "collective backend 'shoal' registered", f"unknown ({type(e).__name__}: {e})", True))
    try:
        from ray.experimental.rdt import util

        from shoal.ray.transport import TRANSPORT_NAME

        ok = TRANSPORT_NAME in util.transport_manager_info
        items.append(("ray", "tensor transport 'shoal' registered",
                      "yes: @ray.method(tensor_transport='shoal') works" if ok
                      else "no: import shoal in the driver and the actors", not ok))
    except Exception as e:  # noqa: BLE001
        items.append(("ray", "tensor transport 'shoal' registered", f"unknown ({type(e).__name__}: {e})", True))
    return items


def trial_items(ranks: int) -> list[tuple[str, str, str, bool]]:
    """The group of `ranks` ranks, formed by a fresh interpreter: its ranks are forked, and a fork
    is safe only where no other thread holds a lock (this process may run torch's or Ray's)."""
    import json
    import subprocess

    code = ("import json, sys; from shoal import _C; "
            f"json.dump([i for i in _C.doctor_items({ranks}, True) if i[0].startswith('trial')], sys.stdout)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if r.returncode != 0:
        return [(f"trial group of {ranks} ranks", "error", (r.stderr.strip() or "failed")[-500:], True)]
    return [tuple(i) for i in json.loads(r.stdout)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shoal doctor", description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=None, metavar="N",
                   help="size the report for N ranks on this host and form a group of N ranks here "
                        "(default: one rank per core, no group)")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.add_argument("--params", action="store_true", help="every SHOAL_* variable: meaning and default")
    a = p.parse_args(argv)
    if a.n is not None and not 1 <= a.n <= 4096:
        p.error(f"-n needs a number of ranks from 1 to 4096, got {a.n}")
    try:
        from shoal import _C
    except ImportError as e:
        print(f"python -m shoal doctor: shoal's extension does not load ({e}); the C++ package's "
              "shoal-doctor gives the same report without torch", file=sys.stderr)
        return 2
    if a.params:
        print(_C.doctor_params(), end="")
        return 0
    items = _C.doctor_items(a.n or os.cpu_count() or 1, False) + (trial_items(a.n) if a.n else []) + python_items()
    print(_C.doctor_format(items, a.json), end="")
    return 1 if any(w for *_, w in items) else 0
