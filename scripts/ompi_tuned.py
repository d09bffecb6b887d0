#!/usr/bin/env python3
"""Open MPI as a user gets it and tuned: shoal against Open MPI's default choice and against the
best of its `coll_tuned_<op>_algorithm` choices, per size.

    scripts/ompi_tuned.py [--ops allreduce,broadcast] [-n 4] [-b 8] [-e 64M] [-f 8] [--json FILE]

For each op it runs `build/shoal-bench OP -n N -b B -e E -f F --check --vs ompi` once with Open
MPI's defaults and once per algorithm Open MPI offers for the op (listed by `ompi_info --param
coll tuned --level 9`), each with `--mpirun-args "--mca coll_tuned_use_dynamic_rules 1 --mca
coll_tuned_<op>_algorithm K"`. Every run times shoal too (the same op and sizes, same run); the
table gives shoal's median over the runs, Open MPI's default, its best algorithm per size (which
one, and its time), and the ratios ompi/shoal (above 1: shoal is faster). Every result is
checked (--check); a failed check or run stops the script.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# shoal-bench's op -> Open MPI's collective name in coll_tuned_<name>_algorithm
OMPI_NAME = {"allreduce": "allreduce", "broadcast": "bcast", "reduce": "reduce", "allgather": "allgather",
             "reduce_scatter": "reduce_scatter_block", "gather": "gather", "scatter": "scatter",
             "alltoall": "alltoall", "barrier": "barrier"}


def algorithms(name: str) -> dict[int, str]:
    """{id: name} of coll_tuned_<name>_algorithm's valid values, without 0 ("ignore": the default)."""
    out = subprocess.run(["ompi_info", "--param", "coll", "tuned", "--level", "9"], capture_output=True,
                         text=True, check=True).stdout
    m = re.search(rf'parameter "coll_tuned_{name}_algorithm" .*?Valid values: ([^\n]*)', out, re.S)
    if not m:
        raise SystemExit(f"ompi_info lists no coll_tuned_{name}_algorithm")
    return {int(k): v for k, v in re.findall(r'(\d+):"([^"]+)"', m.group(1)) if int(k) != 0}


def run(bench: str, op: str, a, mpirun_args: str) -> list[dict] | None:
    """shoal-bench's rows; None when Open MPI refuses the algorithm at this rank count (some exist
    for two ranks only, for example)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [bench, op, "-n", str(a.ranks), "-b", a.minbytes, "-e", a.maxbytes, "-f", str(a.stepfactor),
               "--check", "--vs", "ompi", "--json", f.name]
        if mpirun_args:
            cmd += ["--mpirun-args", mpirun_args]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0 and "MPI_ERR_UNSUPPORTED_OPERATION" in r.stdout + r.stderr:
            return None
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout}{r.stderr}")
        res = json.load(open(f.name))
    if "ompi" not in res:
        raise SystemExit("shoal-bench was built without Open MPI: " + "; ".join(res.get("notes", [])))
    rows = [x for x in res["rows"] if "skipped" not in x]
    for x in rows:
        if x.get("check") != "ok" or x.get("ompi_check") != "ok":
            raise SystemExit(f"{op} {x['bytes']} B: check failed: shoal {x.get('check')}, ompi {x.get('ompi_check')}")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default="allreduce")
    ap.add_argument("-n", "--ranks", type=int, default=4)
    ap.add_argument("-b", "--minbytes", default="8")
    ap.add_argument("-e", "--maxbytes", default="64M")
    ap.add_argument("-f", "--stepfactor", type=int, default=8)
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "shoal-bench"))
    ap.add_argument("--json", help="write every run's rows here")
    a = ap.parse_args()
    everything = {}
    for op in a.ops.split(","):
        name = OMPI_NAME[op]
        algos = algorithms(name)
        runs = {"default": run(a.bench, op, a, "")}
        refused = []
        for k, algo in algos.items():
            rows = run(a.bench, op, a, f"--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_{name}_algorithm {k}")
            if rows is None:
                refused.append(algo)
            else:
                runs[algo] = rows
        everything[op] = runs
        print(f"\n### {op}, {a.ranks} ranks, f32: shoal against Open MPI's default and its best tuned algorithm\n")
        print(f"`{os.path.relpath(__file__, ROOT)} --ops {op} -n {a.ranks} -b {a.minbytes} -e {a.maxbytes} "
              f"-f {a.stepfactor}`: {len(runs)} runs of shoal-bench (default, then each of "
              f"{', '.join(al for al in runs if al != 'default')}); shoal: median over the runs (min-max)."
              + (f" Open MPI refused {', '.join(refused)} at {a.ranks} ranks." if refused else "") + "\n")
        print("| size | shoal µs | ompi default µs | ompi tuned µs (algorithm) | default/shoal | tuned/shoal |")
        print("|---:|---:|---:|---:|---:|---:|")
        for i, row in enumerate(runs["default"]):
            shoal = [rs[i]["shoal_us"] for rs in runs.values()]
            med = statistics.median(shoal)
            dflt = row["ompi_us"]
            best_algo, best = min(((al, rs[i]["ompi_us"]) for al, rs in runs.items() if al != "default"),
                                  key=lambda t: t[1])
            print(f"| {row['bytes']} | {med:.2f} ({min(shoal):.2f}-{max(shoal):.2f}) | {dflt:.2f} | "
                  f"{best:.2f} ({best_algo}) | {dflt / med:.2f} | {best / med:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(everything, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
