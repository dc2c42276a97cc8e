"""A program's control run: the same program once per distinct workload, over loopback on
this machine, before any network is built or rank interpreter started (``program.control``).

It is what ``torchrun --nproc_per_node <world>`` would run here: one node, torchrun's
environment, traced by the same instrument. What each row then says about it is read from the
traces by ``testbed.readout.control``.

Control runs live in ``<run>/control/<key>/`` (a cell directory's layout; ``control.json``
holds the metrics) and are reused by ``--resume``.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from testbed.cell.celldir import CellDir
from testbed.errors import StorageError, TestbedError, writing
from testbed.launch.interpreters import Interpreters
from testbed.launch.loopback import run_program_local
from testbed.plan import CellPlan
from testbed.readout.control import control_key, control_metrics, wants_control
from testbed.runner.store import atomic_write
from testbed.runner.tracewatch import IterationWatch
from testbed.spec import Workload

log = logging.getLogger(__name__)

CONTROL_DIR = "control"
CONTROL_JSON = "control.json"


def run_controls(plans: list[CellPlan], run_root: Path, say=print,
                 interpreters: Interpreters | None = None) -> dict[str, dict]:
    """Run (or reuse, on resume) one control run per distinct workload that asks for one;
    key → its metrics, or {"error": …} when it failed (its rows then say so). Its ranks are
    forked from ``interpreters`` when given, as the cells' are."""
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
        out[key] = _run_one(w, d, plan.experiment.timeout_s, interpreters)
        atomic_write(saved, json.dumps(out[key], indent=2).encode())
        log.info("control run %s: %s", key, out[key])
    return out


def _run_one(w: Workload, d: Path, timeout_s: float,
             interpreters: Interpreters | None) -> dict[str, Any]:
    with writing(d, "create"):
        d.mkdir(parents=True, exist_ok=True)
    watches = {r: IterationWatch(Path(CellDir(d).trace(r))) for r in range(w.world_size)}
    try:
        exits = run_program_local(w, d, timeout_s, lambda: {
            r for r, x in watches.items() if x.done() >= w.iterations}, interpreters)
        return control_metrics(d, w, finished=not exits)
    except StorageError:
        raise
    except TestbedError as e:  # the program failed over loopback too: its rows say so
        return {"error": str(e).splitlines()[0]}
