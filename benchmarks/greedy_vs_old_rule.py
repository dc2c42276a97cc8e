"""Does the new ``crosspipe_greedy`` ever predict a longer iteration than the rule it replaced?

For every cell of every shipped experiment (``experiments/*.yaml``; the crosspipe experiments'
own grids included), with ``workload.schedule`` set to ``crosspipe_greedy``, the simulator's
prediction (``testbed.plan.predict`` under the cell's plan, calibrated costs included) with
today's generator and with the generator of ``--old-rev`` (default: the commit before issue 18,
fixed priority I > F > W, float ties), loaded from git. Cells whose schedule needs chunks > 1
are skipped, and so are cells the greedy cannot be planned for (no modelled compute times, e.g.
a ``workload.program`` with real compute; listed); identical experiments (cells differing only
in the schedule) are counted once.

    .venv/bin/python benchmarks/greedy_vs_old_rule.py [--csv OUT.csv] [--save]

Prints one line per configuration and exits 1 if any new prediction is longer than the old
one by more than ``TOLERANCE_S``. ``--save`` writes what it prints to
results/benchmarks/greedy_vs_old_rule.md and the rows to greedy_vs_old_rule.csv.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import subprocess
import sys
import types
from pathlib import Path

from testbed.plan import PlanError, plan_cell, predict
from testbed.schedule import crossdc
from testbed.spec import PROJECT_ROOT, load_experiment

from benchsave import add_save, saved

OLD_REV = "2882731"  # main before issue 18: crosspipe_greedy with the fixed I > F > W rule
TOLERANCE_S = 1e-6  # float noise of the simulator, far below one action's software cost


def old_generator(rev: str):
    """``crosspipe_greedy`` as it was at ``rev`` (its crossdc module, run from git)."""
    src = subprocess.run(["git", "show", f"{rev}:testbed/schedule/crossdc.py"], check=True,
                         capture_output=True, text=True, cwd=PROJECT_ROOT).stdout
    mod = types.ModuleType("crossdc_old")
    sys.modules[mod.__name__] = mod  # dataclasses look their module up
    exec(compile(src, f"{rev}:testbed/schedule/crossdc.py", "exec"), mod.__dict__)
    return mod.crosspipe_greedy


def greedy_cells():
    """(experiment file, cell, the cell with schedule crosspipe_greedy), deduplicated."""
    seen = set()
    for path in sorted((PROJECT_ROOT / "experiments").glob("*.yaml")):
        if path.name.startswith("optical-"):
            continue  # an optical network's file (``python -m testbed optical``), no cells
        for cell in load_experiment(path).cells:
            w = cell.experiment.workload
            if w.chunks != 1:
                continue
            exp = cell.experiment.model_copy(
                update={"workload": w.model_copy(update={"schedule": "crosspipe_greedy"})})
            key = exp.model_dump_json()
            if key not in seen:
                seen.add(key)
                yield path.name, cell, dataclasses.replace(cell, experiment=exp)


def predict_with(generator, cell) -> tuple[float, str]:
    """(predicted iteration s, schedule variant) with ``generator`` as crosspipe_greedy."""
    current = crossdc.CROSS_DC_GENERATORS["crosspipe_greedy"]
    crossdc.CROSS_DC_GENERATORS["crosspipe_greedy"] = generator
    try:
        plan = plan_cell(cell)
        return predict(plan)["predicted_iteration_time_s"], plan.schedule.variant
    finally:
        crossdc.CROSS_DC_GENERATORS["crosspipe_greedy"] = current


def compare_all(old) -> list[dict]:
    """One row per configuration: the old and new prediction; each printed as it comes."""
    rows = []
    for name, cell, greedy_cell in greedy_cells():
        try:
            new_s, rule = predict_with(crossdc.CROSS_DC_GENERATORS["crosspipe_greedy"],
                                       greedy_cell)
        except PlanError as e:
            print(f"{name:26} {cell.cell_id} skipped: {e}")
            continue
        old_s, _ = predict_with(old, greedy_cell)
        params = {k: v for k, v in cell.params.items() if k != "workload.schedule"}
        rows.append({"experiment": name, "cell_id": cell.cell_id, **params,
                     "old_s": old_s, "new_s": new_s, "change_pct": round(
                         100 * (new_s - old_s) / old_s, 2), "schedule_rule": rule})
        print(f"{name:26} {cell.cell_id} {params} old {old_s:.4f} s new {new_s:.4f} s "
              f"({rows[-1]['change_pct']:+.2f} %, {rule})")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-rev", default=OLD_REV)
    ap.add_argument("--csv", type=Path)
    add_save(ap)
    args = ap.parse_args()
    with saved("greedy_vs_old_rule", args.save) as out:
        rows = compare_all(old_generator(args.old_rev))
        worse = [r for r in rows if r["new_s"] > r["old_s"] + TOLERANCE_S]
        print(f"{len(rows)} configurations: {len(worse)} longer, "
              f"{sum(r['new_s'] < r['old_s'] - TOLERANCE_S for r in rows)} shorter, "
              f"largest gain {min(r['change_pct'] for r in rows):+.2f} %")
        out.rows(rows)
    if args.csv:
        fields = list(dict.fromkeys(k for r in rows for k in r))
        with args.csv.open("w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
