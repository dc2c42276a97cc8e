"""The committed example runs' measured iteration times against the simulator as it is now.

Each ``results/<name>-example/`` keeps the experiment as it ran (``experiment.yaml``) and its
rows, with the prediction the run made then (``predicted_iteration_time_s``). The simulator
has changed since some of them ran; this simulates each experiment again (``python -m testbed
simulate``, no root, seconds) and sets per cell the median measured iteration time over
repeats beside both predictions, as ``predicted / measured − 1``:

    .venv/bin/python benchmarks/resimulate.py [NAME …] [--save]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from benchsave import add_save, saved

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ["atlas", "cba", "crosspipe", "hierarchical-unequal", "first"]


def simulated(experiment: Path, out: Path) -> dict[str, float]:
    """cell_id → the simulator's iteration time for ``experiment`` now."""
    res = subprocess.run([sys.executable, "-m", "testbed", "simulate", str(experiment), "--csv",
                          str(out)], cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"simulate {experiment}: exit {res.returncode}\n{res.stderr[-2000:]}")
    rows = pd.read_csv(out)
    return dict(zip(rows["cell_id"], rows["predicted_iteration_time_s"]))


def compare(name: str, tmp: Path) -> list[dict]:
    """Per cell of ``results/<name>-example``: measured, the run's own prediction, today's."""
    run = ROOT / "results" / f"{name}-example"
    rows = pd.read_csv(run / "results.csv")
    rows = rows[(rows["status"] == "ok") & rows["iteration_time_s"].notna()]
    now = simulated(run / "experiment.yaml", tmp / f"{name}.csv")
    out = []
    for cell, group in rows.groupby("cell_id", sort=False):
        measured = statistics.median(group["iteration_time_s"])
        then = statistics.median(group["predicted_iteration_time_s"])
        out.append({"experiment": name, "cell": cell, "schedule": group["schedule"].iloc[0],
                    "measured_s": round(measured, 6), "predicted_then_s": round(then, 6),
                    "predicted_now_s": round(now[cell], 6),
                    "gap_then_pct": round((then / measured - 1) * 100, 2),
                    "gap_now_pct": round((now[cell] / measured - 1) * 100, 2)})
    return out


def summary(rows: list[dict]) -> str:
    then = [r["gap_then_pct"] for r in rows]
    now = [r["gap_now_pct"] for r in rows]
    return (f"{rows[0]['experiment']}: {len(rows)} cells; the run's own prediction "
            f"{min(then):+.2f} … {max(then):+.2f} % (mean |gap| "
            f"{statistics.mean(map(abs, then)):.2f} %), today's {min(now):+.2f} … "
            f"{max(now):+.2f} % (mean |gap| {statistics.mean(map(abs, now)):.2f} %)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", default=DEFAULT,
                    help="results/<name>-example runs (default: %(default)s)")
    add_save(ap)
    args = ap.parse_args()
    with saved("resimulate", args.save) as out, tempfile.TemporaryDirectory() as tmp:
        every = []
        for name in args.names:
            rows = compare(name, Path(tmp))
            every += rows
            cols = [c for c in rows[0] if c != "experiment"]
            print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
            for r in rows:
                print("| " + " | ".join(str(r[c]) for c in cols) + " |")
            print(f"\n{summary(rows)}\n")
        out.rows(every)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
