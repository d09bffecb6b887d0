"""Ray's registrations of shoal in every Python process, without ``import shoal``.

Ray looks collective backends and tensor transports up in per-process registries, so a worker
that never imports shoal fails with "Backend SHOAL not registered" (Ray's guides name the backend
in the driver only: ``create_collective_group(actors, backend="shoal")``). torch has an entry
point group for this (``_shoal_autoload.load``); Ray has none. So the wheel installs
``shoal_ray_autoload.pth``, which Python runs at startup in every process of the environment:
:func:`install` only puts :class:`_Finder` on ``sys.meta_path`` (no import of Ray, torch or
shoal). The finder waits for two of Ray's modules and, right after each has loaded, registers:

* ``ray.util.collective.backend_registry``: the backend "shoal", as ``ray_group.LazyShoalGroup``;
* ``ray.experimental.collective`` (where ``create_collective_group`` lives): the tensor transport
  "shoal", as ``ray_transport.LazyShoalTransport`` (Ray copies the driver's transports to its
  actors, on another thread than their tasks).

Both stand for shoal's classes and import shoal only when an instance is made, one thread at a
time (``lazy_import``): Ray registers the transport in an actor on its ``_ray_system`` thread
while the actor's task may be making a group, and two threads importing the parts of one
package at once can deadlock (Python then raises ``_DeadlockError`` in one of them).

``SHOAL_RAY_AUTOLOAD=0`` turns it off. Nothing here raises: a failure is a warning, and Ray works
as without shoal.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading

_BACKEND = "shoal"
_import_lock = threading.RLock()


def lazy_import(module: str):
    """Imports a module of shoal, one thread at a time (see the module's docstring)."""
    with _import_lock:
        return importlib.import_module(module)


def _warn(what: str, e: BaseException) -> None:
    import warnings

    warnings.warn(f"shoal: could not register {what} with Ray ({type(e).__name__}: {e}); "
                  f"SHOAL_RAY_AUTOLOAD=0 skips this", RuntimeWarning, stacklevel=3)


def _register_backend() -> None:
    if "shoal" in sys.modules:
        return  # `import shoal` registers both itself (shoal.ray.register), maybe being under way
    from ray.util.collective.backend_registry import _global_registry, register_collective_backend

    from .ray_group import LazyShoalGroup

    if not _global_registry.is_registered(_BACKEND):
        register_collective_backend(_BACKEND, LazyShoalGroup)


def _register_transport() -> None:
    if "shoal" in sys.modules:
        return
    import torch
    from ray.experimental.rdt import util

    from .ray_transport import DEVICES, TRANSPORT_NAME, LazyShoalTransport

    if TRANSPORT_NAME not in util.transport_manager_info:
        util.register_tensor_transport(TRANSPORT_NAME, DEVICES, LazyShoalTransport, torch.Tensor)


_AFTER = {
    "ray.util.collective.backend_registry": ("the collective backend 'shoal'", _register_backend),
    "ray.experimental.collective": ("the tensor transport 'shoal'", _register_transport),
}


class _Finder:
    """A meta path finder that finds nothing itself: for the modules in _AFTER it takes the spec
    the other finders give and runs the registration after the module has executed."""

    def find_spec(self, name, path, target=None):
        if name not in _AFTER:
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        what, register = _AFTER[name]
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            try:
                register()
            except Exception as e:  # noqa: BLE001 - never break Ray's import
                _warn(what, e)

        spec.loader.exec_module = exec_then_register
        return spec


def install() -> None:
    """Called by shoal_ray_autoload.pth at interpreter startup."""
    if os.environ.get("SHOAL_RAY_AUTOLOAD", "1") in ("0", "false", "no"):  # a flag, as shoal's settings
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
