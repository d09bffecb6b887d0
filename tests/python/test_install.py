"""The installed package: its version, which torch it was built against, and what another torch gets."""

import importlib.metadata
import importlib.util
import os
import subprocess
import sys

import torch

import shoal._build_info
from shoal._torch_abi import release


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})


def test_records_the_torch_it_was_built_against():
    assert shoal._build_info.TORCH_VERSION == torch.__version__


def test_one_version_everywhere():
    """The file VERSION is the wheel's version, shoal.__version__ and the C++ package's
    (tests/python/test_cpp_package.py checks the installed headers and SONAME against it)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "VERSION")) as f:
        want = f.read().strip()
    assert shoal.__version__ == want
    assert importlib.metadata.version("shoal") == want


def test_ray_extra_pins_the_tested_ray_and_types_are_shipped():
    """pip install shoal[ray] gets the Ray release make test ran (requirements-dev.txt); the
    package carries py.typed (PEP 561), so type checkers read its hints."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "requirements-dev.txt")) as f:
        tested = next(l.split("#")[0].strip() for l in f if l.startswith("ray"))
    extra = [r for r in importlib.metadata.requires("shoal") if 'extra == "ray"' in r]
    assert [r.split(";")[0].strip() for r in extra] == [tested], extra
    assert os.path.isfile(os.path.join(os.path.dirname(shoal.__file__), "py.typed"))


def test_metadata_asks_for_the_torch_release_it_was_built_against():
    # The release without its local label: CPU and CUDA builds of it both satisfy the requirement.
    reqs = [r for r in importlib.metadata.requires("shoal") if "extra ==" not in r]
    assert sorted(reqs) == sorted([f"torch=={release(torch.__version__)}", "numpy"]), reqs
    assert shoal._build_info.TORCH_VERSION.startswith(release(torch.__version__))


# The version is changed in the child before shoal is imported: the check reads torch.__version__.
OTHER = "2.99.1+cpu"


def test_another_torch_release_is_an_error_naming_both():
    r = python(f"import torch; torch.__version__ = {OTHER!r}\n"
               "try:\n    import shoal\nexcept ImportError as e:\n    print(type(e).__name__, e)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("TorchVersionError"), r.stdout
    assert OTHER in r.stdout and shoal._build_info.TORCH_VERSION in r.stdout, r.stdout


def test_another_torch_release_through_the_autoload():
    # `import torch` registers "shoal" without importing it; making the group imports it.
    r = python(f"import torch, torch.distributed as dist; torch.__version__ = {OTHER!r}\n"
               "try:\n"
               "    dist.init_process_group('shoal', init_method='tcp://127.0.0.1:0', rank=0, world_size=1)\n"
               "except Exception as e:\n    print(type(e).__name__, e)\n")
    assert r.returncode == 0, r.stderr
    assert OTHER in r.stdout and shoal._build_info.TORCH_VERSION in r.stdout, r.stdout + r.stderr


def test_another_build_of_the_same_release_is_accepted():
    other_build = release(torch.__version__) + "+cu999"
    r = python(f"import torch; torch.__version__ = {other_build!r}; import shoal.torch; print('ok')")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_public_python_api_is_typed():
    """Every public function and method of the package's modules (their __all__, or their public
    names) annotates its parameters and its return, as py.typed promises to type checkers."""
    import inspect

    modules = ["shoal", "shoal.torch", "shoal.doctor", "shoal.bench", "shoal.demo"]
    if importlib.util.find_spec("ray") is not None:
        modules += ["shoal.ray", "shoal.ray.group", "shoal.ray.transport", "shoal.ray.worker_group"]
    missing = []
    for name in modules:
        mod = importlib.import_module(name)
        for attr in getattr(mod, "__all__", None) or [n for n in dir(mod) if not n.startswith("_")]:
            obj = getattr(mod, attr, None)
            if getattr(obj, "__module__", None) != name:
                continue  # imported from elsewhere
            funcs = [(attr, obj)]
            if inspect.isclass(obj):
                funcs = [(f"{attr}.{k}", v) for k, v in vars(obj).items()
                         if (not k.startswith("_") or k == "__init__") and inspect.isfunction(v)]
            for qual, f in funcs:
                if not inspect.isfunction(f):
                    continue
                sig = inspect.signature(f)
                bare = [p.name for p in sig.parameters.values() if p.name not in ("self", "cls")
                        and p.annotation is inspect.Parameter.empty]
                if bare or (sig.return_annotation is inspect.Signature.empty and f.__name__ != "__init__"):
                    missing.append(f"{name}.{qual}: parameters {bare}"
                                   + (", return" if sig.return_annotation is inspect.Signature.empty else ""))
    assert not missing, "\n".join(missing)
