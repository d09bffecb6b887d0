import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from harness import Group  # noqa: E402

WORLD_SIZES = [1, 2, 3, 4]

_groups: dict[int, Group] = {}


def get_group(world_size: int) -> Group:
    """A process group of `world_size` ranks kept for the session (restarted if broken)."""
    g = _groups.get(world_size)
    if g is None or g.broken:
        if g is not None:
            g.close()
        # Only one pool alive at a time: the machine may have 2 cores.
        for ws in list(_groups):
            _groups.pop(ws).close()
        g = _groups[world_size] = Group(world_size)
    return g


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray (started once per test session, shut down at its end) with `import shoal` done
    in the driver. Logical CPUs outnumber the machine's: actors in the tests ask for num_cpus=1
    and groups of 8 must fit. The 4 GPUs are logical too (Ray hands out their ids and sets
    CUDA_VISIBLE_DEVICES without hardware): test_ray_worker_group.py checks how they are shared."""
    ray = pytest.importorskip("ray")
    import shoal  # noqa: F401  registers the collective backend and the tensor transport

    if not ray.is_initialized():
        ray.init(num_cpus=16, num_gpus=4, include_dashboard=False, logging_level="warning",
                 runtime_env={"env_vars": {"SHOAL_TIMEOUT": os.environ.get("SHOAL_TIMEOUT", "120")}})
    yield ray
    ray.shutdown()


@pytest.fixture(params=WORLD_SIZES, ids=lambda n: f"n{n}")
def group(request):
    return get_group(request.param)


@pytest.fixture(params=[n for n in WORLD_SIZES if n > 1], ids=lambda n: f"n{n}")
def group2(request):
    """Groups of at least two ranks."""
    return get_group(request.param)


def pytest_collection_modifyitems(config, items):
    # In the child run of test_torch_suite.py, keep the selected subset of torch's suite.
    if os.environ.get("SHOAL_TORCH_SUITE_CHILD") == "1":
        import test_torch_suite

        keep = [i for i in items if i.module.__name__ != "test_torch_suite" or test_torch_suite.selected(i.name)]
        dropped = [i for i in items if i not in keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep

    # Run every test of one world size together, so that each pool starts once.
    def key(item):
        cs = getattr(item, "callspec", None)
        for name in ("group", "group2"):
            if cs is not None and name in cs.params:
                return (0, cs.params[name])
        return (1, 0)

    items.sort(key=key)


def pytest_sessionfinish(session, exitstatus):
    for g in _groups.values():
        g.close()
    _groups.clear()
