"""A program's control run: the same program once per distinct workload, over loopback on
this machine, before any network is built or rank interpreter started (``program.control``).

It is what ``torchrun --nproc_per_node <world>`` would run here: one node, torchrun's
environment, traced by the same instrument. Each row of that workload then says

- ``control_iteration_time_s``, ``control_bubble_ratio``: the program's intrinsic iteration
  time and bubble (no emulated network);
- ``network_added_s``, ``network_added_bubble``: what the emulated network added to them,
  measured (the row's minus the control's);
- ``compute_vs_control_pct``: how much longer the ranks' compute took in the cell than in the
  control run (median busy time per iteration, summed over ranks): the harness's or the box's
  distortion of the program, which fidelity checks (``testbed.runner.fidelity``).

Control runs live in ``<run>/control/<key>/`` (a cell directory's layout; ``control.json``
holds the metrics) and are reused by ``--resume``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import statistics
from pathlib import Path
from typing import Any

from testbed.errors import TestbedError
from testbed.cell.celldir import CellDir
from testbed.launch.loopback import run_program_local
from testbed.metrics import by_period, load_traces, per_iteration, summarize
from testbed.plan import CellPlan
from testbed.runner.tracewatch import IterationWatch
from testbed.spec import Workload

log = logging.getLogger(__name__)

CONTROL_DIR = "control"
CONTROL_JSON = "control.json"


def control_key(w: Workload) -> str:
    """The same key for the same workload (its settings as the file resolves them)."""
    text = json.dumps(w.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def wants_control(plan: CellPlan) -> bool:
    w = plan.experiment.workload
    return w.program is not None and w.program.control


def run_controls(plans: list[CellPlan], run_root: Path, say=print) -> dict[str, dict]:
    """Run (or reuse, on resume) one control run per distinct workload that asks for one;
    key → its metrics, or {"error": …} when it failed (its rows then say so)."""
    out: dict[str, dict] = {}
    for plan in plans:
        w = plan.experiment.workload
        key = control_key(w)
        if not wants_control(plan) or key in out:
            continue
        d = Path(run_root) / CONTROL_DIR / key
        saved = d / CONTROL_JSON
        if saved.is_file():
            out[key] = json.loads(saved.read_text(encoding="utf-8"))
            continue
        say(f"control run {key} (cell {plan.cell.cell_id}): the program over loopback, "
            f"no emulated network")
        out[key] = _run_one(w, d, plan.experiment.timeout_s)
        saved.write_text(json.dumps(out[key], indent=2), encoding="utf-8")
        log.info("control run %s: %s", key, out[key])
    return out


def _run_one(w: Workload, d: Path, timeout_s: float) -> dict[str, Any]:
    d.mkdir(parents=True, exist_ok=True)
    watches = {r: IterationWatch(Path(CellDir(d).trace(r))) for r in range(w.world_size)}
    try:
        exits = run_program_local(w, d, timeout_s, lambda: {
            r for r, x in watches.items() if x.done() >= w.iterations})
        return control_metrics(d, w, finished=not exits)
    except TestbedError as e:
        return {"error": str(e).splitlines()[0]}


def control_metrics(d: Path, w: Workload, finished: bool = True) -> dict[str, Any]:
    """Iteration time, bubble and median busy time of a control run's traces (period basis).
    Raises WorkerError on bad traces."""
    iters = by_period(per_iteration(load_traces(d, finished=finished)))
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
