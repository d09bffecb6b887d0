"""Ray's guides run with the backend named "shoal" and no ``import shoal`` anywhere: the wheel's
shoal_ray_autoload.pth registers shoal with Ray in every process that loads Ray's collective
modules (python/_shoal_autoload/ray_hook.py); SHOAL_RAY_AUTOLOAD=0 turns that off."""

import os
import subprocess
import sys
import textwrap

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("torch")


def python(code: str, env=None, timeout=120) -> str:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


REGISTRY = """
    import sys
    assert "ray" not in sys.modules  # the hook itself imports nothing
    from ray.util.collective.backend_registry import _global_registry
    print(_global_registry.is_registered("shoal"), "shoal" in sys.modules)
    if _global_registry.is_registered("shoal"):
        print(_global_registry.get("shoal").__name__)
"""


def test_registered_lazily_and_switched_off():
    assert python(REGISTRY).split() == ["True", "False", "LazyShoalGroup"]  # shoal not imported yet
    assert python(REGISTRY, env={"SHOAL_RAY_AUTOLOAD": "0"}).split() == ["False", "False"]


GUIDES = """
    import os
    import sys

    import ray
    import torch
    import ray.util.collective as col
    from ray.experimental.collective import create_collective_group

    assert "shoal" not in sys.modules or os.environ.get("SHOAL_RAY_AUTOLOAD") != "0"
    ray.init(address=os.environ["SHOAL_TEST_RAY_ADDRESS"], logging_level="warning")

    # Ray's Direct Transport guide, "gloo" -> "shoal"
    @ray.remote
    class MyActor:
        @ray.method(tensor_transport="shoal")
        def random_tensor(self):
            return torch.ones(1000, 1000)

        def sum(self, tensor: torch.Tensor):
            return torch.sum(tensor).item()

    sender, receiver = MyActor.remote(), MyActor.remote()
    group = create_collective_group([sender, receiver], backend="shoal")
    tensor = sender.random_tensor.remote()
    print("rdt", ray.get(receiver.sum.remote(tensor), timeout=120))

    # the custom-backend guide: worker-managed and driver-managed groups
    @ray.remote
    class Worker:
        def setup(self, world_size, rank):
            col.init_collective_group(world_size, rank, backend="shoal", group_name="worker managed")

        def compute(self, name):
            x = torch.ones(8)
            col.allreduce(x, name)
            return x.sum().item(), type(col.get_group_handle(name)).__name__

    ws = [Worker.remote() for _ in range(2)]
    ray.get([w.setup.remote(2, r) for r, w in enumerate(ws)], timeout=120)
    print("worker", *ray.get([w.compute.remote("worker managed") for w in ws], timeout=120))
    ds = [Worker.remote() for _ in range(2)]
    col.create_collective_group(ds, 2, [0, 1], backend="shoal", group_name="driver managed")
    print("driver", *ray.get([w.compute.remote("driver managed") for w in ds], timeout=120))
"""


def test_rays_guides_run_without_import_shoal(ray_local):
    env = {"SHOAL_TEST_RAY_ADDRESS": ray_local.get_runtime_context().gcs_address}
    out = python(GUIDES, env=env, timeout=300).split("\n")
    assert "rdt 1000000.0" in out, out
    assert "worker (16.0, 'ShoalGroup') (16.0, 'ShoalGroup')" in out, out
    assert "driver (16.0, 'ShoalGroup') (16.0, 'ShoalGroup')" in out, out


WITHOUT_TORCH = """
    import json, sys, warnings
    sys.modules["torch"] = None  # as in an environment without torch
    out = {}
    from ray.util.collective.backend_registry import _global_registry
    out["registered"] = _global_registry.is_registered("shoal")
    try:
        _global_registry.get("shoal")(2, 0, "g")  # what init_collective_group makes
        out["group"] = "made"
    except ImportError as e:
        out["group"] = str(e)
    print(json.dumps(out))
"""

IMPORT_WITHOUT_TORCH = """
    import json, sys, warnings
    sys.modules["torch"] = None
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        import shoal
    print(json.dumps({"available": shoal.torch_available(), "warnings": [str(x.message) for x in w]}))
"""


def test_without_torch_the_error_says_the_ray_backend_needs_it():
    """numpy-only Ray users: the backend needs torch (shoal._C is a torch extension). Making a group
    says so, and `import shoal` works and warns with the same reason."""
    import json

    out = json.loads(python(WITHOUT_TORCH).strip().splitlines()[-1])
    assert out["registered"] is True
    assert "shoal's Ray collective backend needs torch" in out["group"], out
    assert "pip install torch" in out["group"], out
    out = json.loads(python(IMPORT_WITHOUT_TORCH).strip().splitlines()[-1])
    assert out["available"] is False
    assert any("the Ray backend is unavailable" in m and "needs torch" in m for m in out["warnings"]), out
