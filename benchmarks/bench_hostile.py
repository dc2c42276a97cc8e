"""How long `validate` takes to refuse hostile files, and to read files at the size caps.

For every kept hostile file (tests/spec/bad/hostile_*.yaml, tests/spec/bad/topologies/) and for
files made here (a FIFO as trace_csv, the densest YAML at MAX_YAML_BYTES, a trace at
MAX_TRACE_BYTES with 6 cells, a matrix of MAX_CELLS cells), runs ``python -m testbed validate``
REPEATS times and prints the median wall and CPU (user + sys of the child) time with its exit
code. Target (issue 16, item 1): every hostile file exits 2 within 2 s. Files at the caps are
valid input and are listed for the cost the caps allow.

Run: ``.venv/bin/python benchmarks/bench_hostile.py [--save]`` (no root needed; it measures
time, so on a quiet machine). With ``--save`` the output goes to
results/benchmarks/bench_hostile.md and one row per file to bench_hostile.csv.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testbed.spec.topofile import MAX_TRACE_BYTES
from testbed.spec.matrix import MAX_CELLS
from testbed.spec.source import MAX_YAML_BYTES

from benchsave import add_save, saved

ROOT = Path(__file__).resolve().parents[1]
BAD = ROOT / "tests" / "spec" / "bad"
REPEATS = 5
TARGET_S = 2.0


def validate(path: Path) -> tuple[int, float, float]:
    """(exit code, wall s, CPU s) of one `validate` run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "testbed", "validate", str(path)], cwd=ROOT,
                       capture_output=True, check=False, timeout=60)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return r.returncode, wall, cpu


def made_files(tmp: Path) -> dict[str, Path]:
    """Files that cannot be kept in git, or are generated at the caps."""
    (tmp / "fifo.csv").unlink(missing_ok=True)
    os.mkfifo(tmp / "fifo.csv")
    header, row = "at_s,delay_ms\n", "1,10\n"
    (tmp / "trace.csv").write_text(header + row * ((MAX_TRACE_BYTES - len(header)) // len(row)))
    topo = ("name: t\ndcs: [{name: dc1, hosts: 4}, {name: dc2, hosts: 4}]\n"
            "links:\n  - dcs: [dc1, dc2]\n")
    (tmp / "fifo-topo.yaml").write_text(topo + "    trace_csv: fifo.csv\n")
    (tmp / "trace-topo.yaml").write_text(topo + "    trace_csv: trace.csv\n")
    files = {"hostile: trace_csv is a FIFO": tmp / "fifo-exp.yaml",
             "cap: densest YAML at MAX_YAML_BYTES": tmp / "dense.yaml",
             "cap: trace at MAX_TRACE_BYTES, 6 cells": tmp / "trace-exp.yaml",
             "cap: matrix of MAX_CELLS cells": tmp / "cells.yaml"}
    files["hostile: trace_csv is a FIFO"].write_text("name: x\ntopology: fifo-topo.yaml\n")
    head = "name: x\ntopology: topologies/two-dc.yaml\ndescription: ["
    files["cap: densest YAML at MAX_YAML_BYTES"].write_text(
        head + "0," * ((MAX_YAML_BYTES - len(head) - 3) // 2) + "0]\n")
    files["cap: trace at MAX_TRACE_BYTES, 6 cells"].write_text(
        "name: x\ntopology: trace-topo.yaml\nmatrix:\n  workload.seed: [1, 2, 3, 4, 5, 6]\n")
    side = int(MAX_CELLS ** 0.5)
    files["cap: matrix of MAX_CELLS cells"].write_text(
        "name: x\ntopology: topologies/two-dc.yaml\nmatrix:\n"
        f"  workload.seed: {list(range(side))}\n  links.inter_dc.delay_ms: {list(range(side))}\n")
    return files


def cases(tmp: Path) -> dict[str, Path]:
    """Every file to validate, by its label: the kept hostile files, then the made ones."""
    found = {f"hostile: {p.relative_to(BAD)}": p for p in sorted(BAD.glob("hostile_*.yaml"))}
    for p in sorted((BAD / "topologies").glob("hostile_*.yaml")):
        exp = tmp / f"uses-{p.name}"
        exp.write_text(f"name: x\ntopology: {p}\n")
        found[f"hostile: {p.relative_to(BAD)}"] = exp
    found.update(made_files(tmp))
    return found


def measure(name: str, path: Path) -> dict:
    """Median wall and CPU time of REPEATS `validate` runs of one file, and its verdict."""
    runs = [validate(path) for _ in range(REPEATS)]
    codes = sorted({c for c, _, _ in runs})
    wall = statistics.median(w for _, w, _ in runs)
    verdict = "-"
    if name.startswith("hostile"):
        verdict = "PASS" if codes == [2] and wall < TARGET_S else "FAIL"
    return {"file": name, "exit": "/".join(map(str, codes)), "wall_s": round(wall, 2),
            "cpu_s": round(statistics.median(c for _, _, c in runs), 2), "target": verdict}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_save(ap)
    args = ap.parse_args()
    with saved("bench_hostile", args.save) as out, tempfile.TemporaryDirectory() as d:
        print(f"{'file':58} {'exit':>4} {'wall s':>7} {'cpu s':>6}  target")
        rows = []
        for name, path in cases(Path(d)).items():
            rows.append(measure(name, path))
            r = rows[-1]
            print(f"{name:58} {r['exit']:>4} {r['wall_s']:7.2f} {r['cpu_s']:6.2f}  "
                  f"{r['target']}")
        print(f"median of {REPEATS} runs; target: hostile files exit 2 within {TARGET_S} s; "
              f"load average {os.getloadavg()[0]:.1f}")
        out.rows(rows)
    return 1 if any(r["target"] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
