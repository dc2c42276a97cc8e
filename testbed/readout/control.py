"""What a program's control run (``testbed.runner.control``: the program over loopback, no
emulated network) says, and what each row of its workload gets from it:

- ``control_iteration_time_s``, ``control_bubble_ratio``: the program's intrinsic iteration
  time and bubble (no emulated network);
- ``network_added_s``, ``network_added_bubble``: what the emulated network added to them,
  measured (the row's minus the control's);
- ``compute_vs_control_pct``: how much longer the ranks' compute took in the cell than in the
  control run (median busy time per iteration, summed over ranks): the harness's or the box's
  distortion of the program, which fidelity checks (``testbed.readout.fidelity``).
"""
from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path
from typing import Any

from testbed.cell.celldir import CellDir
from testbed.plan import CellPlan
from testbed.readout.traces import (by_period, iterations_from_optimizer, load_traces,
                                    per_iteration, summarize)
from testbed.spec import Workload


def control_key(w: Workload) -> str:
    """The same key for the same workload (its settings as the file resolves them)."""
    text = json.dumps(w.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def wants_control(plan: CellPlan) -> bool:
    w = plan.experiment.workload
    return w.program is not None and w.program.control


def control_metrics(d: Path, w: Workload, finished: bool = True) -> dict[str, Any]:
    """Iteration time, bubble and median busy time of a control run's traces (period basis).
    Raises WorkerError on bad traces."""
    traces = load_traces(d, finished=finished)
    if not any(r.get("type") == "iter" for recs in traces.values() for r in recs):
        traces = iterations_from_optimizer(traces, w.warmup)  # as the cell's (readout)
    iters = by_period(per_iteration(traces))
    got, busy = summarize(iters, w), busy_per_iteration(iters)
    return {"iteration_time_s": got["iteration_time_s"],
            "bubble_ratio": None if busy is None else got["bubble_ratio"], "busy_s": busy}


def busy_per_iteration(iters: list[dict]) -> float | None:
    """Median over iterations of the compute time summed over ranks (s); None without any."""
    sums = [sum(i["busy_s"].values()) for i in iters]
    return statistics.median(sums) if sums and any(sums) else None


def control_columns(plan: CellPlan, controls: dict[str, dict], row: dict[str, Any],
                    cell_dir: Path) -> dict[str, Any]:
    """The row's control columns (empty when its workload has no control run)."""
    if not wants_control(plan):
        return {}
    c = controls.get(control_key(plan.experiment.workload), {})
    if "error" in c or not c:
        return {"control_error": c.get("error", "no control run")}
    out: dict[str, Any] = {"control_iteration_time_s": c["iteration_time_s"],
                           "control_bubble_ratio": c["bubble_ratio"]}
    if row.get("iteration_time_s") is not None:
        out["network_added_s"] = round(row["iteration_time_s"] - c["iteration_time_s"], 6)
    if row.get("bubble_ratio") is not None and c["bubble_ratio"] is not None:
        out["network_added_bubble"] = round(row["bubble_ratio"] - c["bubble_ratio"], 6)
    if c.get("busy_s") and CellDir(cell_dir).traces():
        iters = by_period(per_iteration(load_traces(cell_dir, finished=False)))
        busy = busy_per_iteration(iters)
        if busy is not None:
            out["compute_vs_control_pct"] = round((busy / c["busy_s"] - 1) * 100, 3)
    return out
