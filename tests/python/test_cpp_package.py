"""The C++ package, as a C++ user gets it: `cmake --install` of the build into a temporary prefix,
then examples/cpp built against that prefix alone, once with find_package(shoal) and once with
pkg-config, and run at 3 ranks under the installed shoal-run."""

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("SHOAL_BUILD_DIR", os.path.join(ROOT, "build"))
EXAMPLE = os.path.join(ROOT, "examples", "cpp")
C_EXAMPLE = os.path.join(ROOT, "examples", "c", "collectives.c")

pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(BUILD, "CMakeCache.txt")),
                                reason="no C++ build (make build)")


# The examples run as a user's would: none of the test run's SHOAL_* settings (SHOAL_TRANSPORT...).
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}


def run(cmd, **kw):
    kw.setdefault("env", CLEAN_ENV)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def version():
    with open(os.path.join(ROOT, "VERSION")) as f:
        return f.read().strip()


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    p = str(tmp_path_factory.mktemp("prefix"))
    run(["cmake", "--install", BUILD, "--prefix", p])
    return p


def libdir(prefix):
    hits = [d for d, _, files in os.walk(prefix) if "libshoal.so" in files]
    assert len(hits) == 1, hits
    return hits[0]


def check_ranks(out, n):
    lines = sorted(l for l in out.splitlines() if l.startswith("rank "))
    want = float(n * (n + 1) // 2)
    assert lines == sorted(f"rank {r} of {n}: allreduce {want:g}, broadcast 42, over {'self' if n == 1 else 'shm'}"
                           f" (shoal {version()})" for r in range(n)), out


def test_install_lays_out_library_headers_tools_and_package_files(prefix):
    lib = libdir(prefix)
    major, minor, _ = version().split(".")
    soname = f"libshoal.so.{major}.{minor}"
    assert os.readlink(os.path.join(lib, "libshoal.so")) == soname
    assert os.readlink(os.path.join(lib, soname)) == f"libshoal.so.{version()}"
    dyn = run(["readelf", "-d", os.path.join(lib, "libshoal.so")])
    assert f"Library soname: [{soname}]" in dyn, dyn
    for h in ("communicator.h", "error.h", "store.h", "types.h", "work.h", "version.h", "c.h"):
        assert os.path.isfile(os.path.join(prefix, "include", "shoal", h)), h
    for tool in ("shoal-run", "shoal-store", "shoal-doctor", "shoal-bench"):
        assert os.access(os.path.join(prefix, "bin", tool), os.X_OK), tool
    # The installed doctor runs against the installed library (its RPATH) and reports its version.
    doc = subprocess.run([os.path.join(prefix, "bin", "shoal-doctor"), "--json"], capture_output=True, text=True,
                         env={k: v for k, v in CLEAN_ENV.items() if k != "LD_LIBRARY_PATH"})
    assert json.loads(doc.stdout)["sections"]["shoal"]["version"] == version(), doc.stdout + doc.stderr
    assert os.path.isfile(os.path.join(lib, "cmake", "shoal", "shoalConfig.cmake"))
    assert os.path.isfile(os.path.join(lib, "cmake", "shoal", "shoalConfigVersion.cmake"))
    pc = os.path.join(lib, "pkgconfig", "shoal.pc")
    assert f"Version: {version()}" in open(pc).read()
    # The installed tools find the installed library (their RPATH), not the build's.
    env = {k: v for k, v in CLEAN_ENV.items() if k != "LD_LIBRARY_PATH"}
    ldd = run(["ldd", os.path.join(prefix, "bin", "shoal-run")], env=env)
    found = [l.split("=>")[1].split("(")[0].strip() for l in ldd.splitlines() if l.strip().startswith(soname)]
    assert [os.path.realpath(f) for f in found] == [os.path.realpath(os.path.join(lib, soname))], ldd


def test_example_with_find_package(prefix, tmp_path):
    build = str(tmp_path / "example")
    run(["cmake", "-S", EXAMPLE, "-B", build, f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release"])
    run(["cmake", "--build", build])
    exe = os.path.join(build, "allreduce_broadcast")
    for n in (1, 3):
        check_ranks(run([os.path.join(prefix, "bin", "shoal-run"), "-n", str(n), exe]), n)
    # Outside shoal-run it says how to run it.
    r = subprocess.run([exe], capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")})
    assert r.returncode == 2 and "shoal-run -n N" in r.stderr, r.stderr


def test_example_with_pkg_config(prefix, tmp_path):
    if not shutil.which("pkg-config") or not shutil.which("cc") or not shutil.which("c++"):
        pytest.skip("no pkg-config or compiler")
    env = dict(CLEAN_ENV, PKG_CONFIG_PATH=os.path.join(libdir(prefix), "pkgconfig"))
    flags = run(["pkg-config", "--cflags", "--libs", "shoal"], env=env).split()
    # The .pc file is relocatable: its paths follow wherever the prefix is.
    paths = {f[:2]: os.path.realpath(f[2:]) for f in flags if f[:2] in ("-I", "-L")}
    assert paths == {"-I": os.path.realpath(os.path.join(prefix, "include")), "-L": os.path.realpath(libdir(prefix))}, flags
    assert "-lshoal" in flags, flags
    exe = str(tmp_path / "allreduce_broadcast")
    run(["c++", "-std=c++17", "-Wall", "-Wextra", "-Werror", os.path.join(EXAMPLE, "allreduce_broadcast.cpp"),
         "-o", exe, *flags, f"-Wl,-rpath,{libdir(prefix)}"])
    check_ranks(run([os.path.join(prefix, "bin", "shoal-run"), "-n", "3", exe]), 3)


@pytest.mark.parametrize("std", ["c++17", "c++20"])
@pytest.mark.parametrize("cxx", ["g++", "clang++"])
def test_public_headers_compile_alone(prefix, tmp_path, cxx, std):
    """Each installed header on its own, warnings as errors."""
    if not shutil.which(cxx):
        pytest.skip(f"no {cxx}")
    inc = os.path.join(prefix, "include")
    for h in sorted(os.listdir(os.path.join(inc, "shoal"))):
        src = tmp_path / f"{h}.cpp"
        src.write_text(f"#include <shoal/{h}>\n")
        run([cxx, f"-std={std}", "-Wall", "-Wextra", "-Wpedantic", "-Werror", f"-I{inc}", "-fsyntax-only", str(src)])


def test_c_api_from_a_c_program(prefix, tmp_path):
    """shoal/c.h from C99 (pkg-config), at 3 ranks: every op's result and the error codes."""
    if not shutil.which("pkg-config") or not shutil.which("cc") or not shutil.which("c++"):
        pytest.skip("no pkg-config or compiler")
    env = dict(CLEAN_ENV, PKG_CONFIG_PATH=os.path.join(libdir(prefix), "pkgconfig"))
    flags = run(["pkg-config", "--cflags", "--libs", "shoal"], env=env).split()
    exe = str(tmp_path / "collectives")
    run(["cc", "-std=c99", "-Wall", "-Wextra", "-Wpedantic", "-Werror", C_EXAMPLE, "-o", exe, *flags,
         f"-Wl,-rpath,{libdir(prefix)}"])
    out = run([os.path.join(prefix, "bin", "shoal-run"), "-n", "3", exe])
    assert sorted(l for l in out.splitlines() if "C API" in l) == [f"rank {r} of 3: C API ok" for r in range(3)], out
