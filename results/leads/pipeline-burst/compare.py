"""Measured iteration times against the simulator as it is and with the shaper's burst applied
to pipeline messages too (sim_burst.py). Run from the repository root:

    .venv/bin/python results/leads/pipeline-burst/compare.py > results/leads/pipeline-burst/comparison.md
"""
import csv
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
TMP = Path(tempfile.mkdtemp())


def predictions(exp: Path, burst: bool) -> dict[str, float]:
    out = TMP / f"{exp.stem}{'-burst' if burst else ''}.csv"
    if not out.exists():
        subprocess.run([sys.executable, str(HERE / "sim_burst.py"), "simulate", str(exp), "--csv",
                        str(out)] + (["--burst"] if burst else []), check=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True)
    return {r["cell_id"]: float(r["predicted_iteration_time_s"]) for r in csv.DictReader(open(out))}


def measured(results: Path) -> list[tuple[str, float]]:
    return [(r["cell_id"], float(r["iteration_time_s"])) for r in csv.DictReader(open(results))
            if r.get("status", "ok") == "ok" and r.get("iteration_time_s")]


def bench_dp(experiment: str) -> list[tuple[str, float]]:
    rows = csv.DictReader(open(ROOT / "results/benchmarks/bench_dp.csv"))
    return [(r["cell"].split("/")[1], float(r["measured"])) for r in rows
            if r["cell"].startswith(experiment + "/") and r["what"] == "iteration s"]


SETS = [  # (what, experiment file, measured rows)
    ("crosspipe, run at the commit of this lead (repeat 1)", HERE / "crosspipe-repeat1.yaml",
     measured(HERE / "crosspipe-fresh-results.csv")),
    ("wan-sharing, bench_dp --save at 6bba178", ROOT / "experiments/wan-sharing.yaml",
     bench_dp("wan-sharing")),
    ("quickstart-example (2026-11-23)", ROOT / "experiments/quickstart.yaml",
     measured(ROOT / "results/quickstart-example/results.csv")),
    ("cba-example (2026-11-23)", ROOT / "experiments/cba.yaml",
     measured(ROOT / "results/cba-example/results.csv")),
    ("atlas-example (2026-11-23)", ROOT / "experiments/atlas.yaml",
     measured(ROOT / "results/atlas-example/results.csv")),
]
print("# Pipeline messages and the shaper's burst: measured iteration times against the "
      "simulator as it is and with the burst (written by compare.py)")
for what, exp, rows in SETS:
    now, burst = predictions(exp, False), predictions(exp, True)
    print(f"\n## {what}\n\n| cell | measured s | gap now % | gap with burst % |\n|---|---|---|---|")
    gaps = []
    for cell, m in rows:
        g = (100 * (m / now[cell] - 1), 100 * (m / burst[cell] - 1))
        gaps.append(g)
        print(f"| {cell} | {m:.6f} | {g[0]:+.2f} | {g[1]:+.2f} |")
    print(f"\nmean |gap|: now {statistics.fmean(abs(g[0]) for g in gaps):.2f} %, with burst "
          f"{statistics.fmean(abs(g[1]) for g in gaps):.2f} %")
