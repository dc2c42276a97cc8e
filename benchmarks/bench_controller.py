"""A controller in the loop on the emulated network (issue 28, item 6), against its targets.

Runs experiments/lightpath-controller.yaml through the runner (netns; a 10 ms, 100 Mbit/s
inter-DC link playing a lightpath of 1–6 slots of 100 Mbit/s, its two directions sharing 8;
pp = 2, 1F1B, 8 microbatches of 1 MiB activations, emulated compute) with CBA's rule and with a
fixed allocation, and checks per cell:

- the measured iteration time within 5 % of the prediction made iteration by iteration with
  the rates the controller had set (``predicted_iteration_time_s``);
- every rate change in force before the next iteration started (``controller_late`` 0: the
  ranks wait for the controller between iterations; a late one would be flagged);
- every rate the shaper had in force after a change equal to the one set
  (``controller_readback_ok``);

and prints, per iteration of the CBA cell, the slots and rates set against measured and
predicted time, and CBA's iteration time over the fixed allocation's from the same run.

    sudo .venv/bin/python benchmarks/bench_controller.py [--save] [--results DIR]
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from benchrun import print_table, run_checked

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = ROOT / "experiments" / "lightpath-controller.yaml"
ITER_PCT = 5.0


def check(df: pd.DataFrame) -> list[dict]:
    rows = []
    for _, r in df.iterrows():
        cell = f"{r['controller_policy']} ({r['cell_id']})"
        if r["status"] != "ok":
            rows.append({"cell": cell, "what": "status", "verdict": f"FAIL: {r['error']}"})
            continue
        gap = round(100 * (r["iteration_time_s"] / r["predicted_iteration_time_s"] - 1), 2)
        rows.append({"cell": cell, "what": "iteration (s)",
                     "configured": r["predicted_iteration_time_s"],
                     "measured": r["iteration_time_s"], "gap_pct": gap,
                     "verdict": "PASS" if abs(gap) <= ITER_PCT else "FAIL"})
        rows.append({"cell": cell, "what": "rate changes / late iterations",
                     "configured": int(r["controller_changes"]),
                     "measured": int(r["controller_late"]),
                     "verdict": "PASS" if r["controller_late"] == 0 else "FAIL"})
        rows.append({"cell": cell, "what": "rates in force = rates set",
                     "measured": bool(r["controller_readback_ok"]),
                     "verdict": "PASS" if r["controller_readback_ok"] else "FAIL"})
    by = {r["controller_policy"]: r for _, r in df.iterrows() if r["status"] == "ok"}
    if {"cba", "fixed"} <= set(by):
        rows.append({"cell": "cba / fixed", "what": "iteration time", "measured": round(
            by["cba"]["iteration_time_s"] / by["fixed"]["iteration_time_s"], 3),
                     "verdict": "ratio"})
    return rows


def per_iteration(df: pd.DataFrame, run_dir: Path) -> None:
    """The CBA cell's controller.csv: slots and rates set, measured and predicted time."""
    for _, r in df[df["controller_policy"] == "cba"].iterrows():
        per = pd.read_csv(run_dir / "cells" / r["cell_id"] / "controller.csv")
        print(f"per iteration, cba ({r['cell_id']}):\n")
        print_table(per.to_dict("records"), list(per.columns))
        print()


def main() -> int:
    return run_checked("bench_controller", EXPERIMENT, __doc__, check,
                       ["cell", "what", "configured", "measured", "gap_pct", "verdict"],
                       per_iteration)


if __name__ == "__main__":
    sys.exit(main())
