"""`shoal doctor` (build/shoal-doctor, and `python -m shoal doctor`): each field against what the
machine really has, asked here without shoal; a tiny /dev/shm (a mount namespace), a bad setting
and a misspelt one are warnings with the exit status 1; `-n N` forms a group and reports it."""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import subprocess
import sys

import pytest

from harness import can_make_containers, container_argv

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DOCTOR = os.path.join(ROOT, "build", "shoal-doctor")

pytestmark = pytest.mark.skipif(not os.path.exists(DOCTOR), reason="build/shoal-doctor is not built (make build)")

# The SHOAL_* variables of the caller would change the report.
CLEAN = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}


def doctor(*args, env=None, prefix=(), timeout=120):
    r = subprocess.run([*prefix, DOCTOR, *args, "--json"], capture_output=True, text=True, timeout=timeout,
                       env={**CLEAN, **(env or {})})
    assert r.returncode in (0, 1), r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert (r.returncode == 1) == bool(rep["warnings"]), r.stdout
    return rep["sections"], rep["warnings"]


def mib(text: str) -> float:
    n, unit = text.split()[:2]
    return float(n) * (1024 if unit == "GiB" else 1)


def test_fields_match_the_machine():
    s, warnings = doctor()
    with open(os.path.join(ROOT, "VERSION")) as f:
        assert s["shoal"]["version"] == f.read().strip()
    assert s["cpu"]["cores online"] == str(os.cpu_count())
    assert s["cpu"]["cores this process may use"] == str(len(os.sched_getaffinity(0)))
    st = os.statvfs("/dev/shm")
    # (the report rounds to 0.1 MiB or GiB; free space moves a little while the test runs)
    assert mib(s["shared memory"]["/dev/shm size"]) == pytest.approx(st.f_blocks * st.f_frsize / 2**20, rel=0.01)
    assert mib(s["shared memory"]["/dev/shm free"]) == pytest.approx(st.f_bavail * st.f_frsize / 2**20, rel=0.05, abs=64)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lim = lambda v: "unlimited" if v == resource.RLIM_INFINITY else str(v)  # noqa: E731
    assert s["file descriptors"]["ulimit -n (soft / hard)"] == f"{lim(soft)} / {lim(hard)}"
    names = {n for _, n in socket.if_nameindex()}
    listed = {k.split(" ", 1)[1].split(":")[0] for k in s["network"] if k.startswith("interface ")}  # eth0:1 is eth0
    assert listed and listed <= names, (listed, names)
    assert "address advertised within this host" in s["network"]
    assert s["settings"] == {"SHOAL_*": "none set: the defaults (`shoal-doctor --params` lists them)"}
    # What this machine lacks (a small /dev/shm, no network but loopback) may be a warning; no
    # setting is.
    assert not [w for w in warnings if w.startswith("settings:")], warnings


def test_the_machines_limits_move_the_report():
    s, _ = doctor(env={"SHOAL_CMA": "0", "SHOAL_SHM_SCRATCH": "1M", "SHOAL_SHM_RING": "64K"})
    assert s["single copy"]["used"].startswith("no: SHOAL_CMA=0")
    assert s["settings"]["SHOAL_CMA"] == "0"
    # One rank per core: rings of 64 KiB to each other rank and 1 MiB of scratch.
    cores = os.cpu_count()
    seg = s["shared memory"][f"segment per rank ({cores} ranks on this host)"]
    assert seg.endswith(f"{cores - 1} inbound ring(s) of 0.1 MiB, scratch 1.0 MiB"), seg
    if shutil.which("prlimit"):
        s, _ = doctor(prefix=("prlimit", "--nofile=40:60"))
        assert s["file descriptors"]["ulimit -n (soft / hard)"] == "40 / 60"


def test_bad_and_misspelt_settings_are_warnings():
    s, warnings = doctor(env={"SHOAL_TIMEOUT": "soon", "SHOAL_TRANSPRT": "tcp", "SHOAL_STORE_TOKEN": "hush-123"})
    assert s["settings"]["SHOAL_TIMEOUT"] == "SHOAL_TIMEOUT='soon': expected seconds from 0.001 to 1000000000"
    assert s["settings"]["SHOAL_TRANSPRT"] == "is not a shoal setting (did you mean SHOAL_TRANSPORT?)"
    assert s["settings"]["SHOAL_STORE_TOKEN"] == "(set)"  # a secret is not printed
    assert "hush-123" not in json.dumps(s)
    assert any(w.startswith("settings: SHOAL_TIMEOUT:") for w in warnings), warnings
    assert any(w.startswith("settings: SHOAL_TRANSPRT:") for w in warnings), warnings


def test_a_group_of_three_reports_its_transports_and_times():
    s, warnings = doctor("-n", "3")
    t = s["trial group of 3 ranks"]
    assert "error" not in t, t
    assert t["rank 0 to rank 1"] == "shm" and t["rank 0 to rank 2"] == "shm", t
    assert float(t["allreduce 4 KiB"].split()[0]) > 0 and float(t["allreduce 16 MiB"].split()[0]) > 0, t
    assert s["shared memory"]["all 3 ranks"]
    s, _ = doctor("-n", "2", env={"SHOAL_TRANSPORT": "tcp"})
    assert s["trial group of 2 ranks"]["rank 0 to rank 1"] == "tcp"
    assert s["trial group of 2 ranks"]["single copy"] == "off"


@pytest.mark.skipif(not can_make_containers(), reason="cannot make IPC and mount namespaces here")
def test_a_small_dev_shm_is_a_warning_and_the_group_says_why():
    s, warnings = doctor("-n", "4", prefix=container_argv("8m"))
    assert mib(s["shared memory"]["/dev/shm size"]) == pytest.approx(8, abs=0.1)
    room = s["shared memory"]["room"]
    assert room.startswith("too little: 4 ranks need") and "SHOAL_SHM_SCRATCH" in room, room
    assert any(w.startswith("shared memory: room:") for w in warnings), warnings
    err = s["trial group of 4 ranks"]["error"]
    assert "/dev/shm" in err, err


def test_params_is_the_settings_table():
    run = os.path.join(ROOT, "build", "shoal-run")
    table = subprocess.run([run, "--settings"], capture_output=True, text=True, check=True).stdout
    assert subprocess.run([DOCTOR, "--params"], capture_output=True, text=True, check=True).stdout == table
    assert table.startswith("| variable | meaning | default |")


def test_python_doctor_adds_torch_and_ray():
    pytest.importorskip("torch")
    r = subprocess.run([sys.executable, "-m", "shoal", "doctor", "--json"], capture_output=True, text=True,
                       timeout=180, env=CLEAN)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    s = json.loads(r.stdout)["sections"]
    import torch

    assert s["torch"]["version"] == torch.__version__
    assert s["torch"]["backend 'shoal' registered"].startswith("yes")
    assert s["python"]["version"] == sys.version.split()[0]
    assert s["cpu"]["cores online"] == str(os.cpu_count())  # the C++ part is there too
    if s["ray"].get("ray") != "not installed":
        assert s["ray"]["collective backend 'shoal' registered"].startswith("yes"), s["ray"]
        assert s["ray"]["tensor transport 'shoal' registered"].startswith("yes"), s["ray"]
    r = subprocess.run([sys.executable, "-m", "shoal", "doctor", "-n", "0x"], capture_output=True, text=True)
    assert r.returncode == 2 and "invalid int value" in r.stderr
    r = subprocess.run([sys.executable, "-m", "shoal", "doctor", "-n", "0"], capture_output=True, text=True)
    assert r.returncode == 2 and "from 1 to 4096" in r.stderr


def test_python_doctor_runs_the_group_in_a_fresh_interpreter():
    pytest.importorskip("torch")
    r = subprocess.run([sys.executable, "-m", "shoal", "doctor", "-n", "2", "--json"], capture_output=True,
                       text=True, timeout=180, env=CLEAN)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    t = json.loads(r.stdout)["sections"]["trial group of 2 ranks"]
    assert "error" not in t and t["rank 0 to rank 1"] == "shm", t
    assert float(t["allreduce 4 KiB"].split()[0]) > 0, t
