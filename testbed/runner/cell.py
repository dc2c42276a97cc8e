"""One cell's lifecycle: build → shape → verify → measure → place → launch → watch → metrics →
row → teardown (always, in reverse order of build, also on failure or interrupt)."""
from __future__ import annotations

import json
import logging
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from testbed.errors import TestbedError
from testbed.net.topology import ResolvedLink
from testbed.placement import Slot
from testbed.plan import CellPlan, plan_cell
from testbed.runner import netops
from testbed.runner.store import RunStore
from testbed.spec import Cell, LoadedExperiment

log = logging.getLogger(__name__)
MASTER_PORT = 29500


class CellRunner:
    """Runs cells of one experiment; a context manager so the shaper choice is probed once."""

    def __init__(self, le: LoadedExperiment, store: RunStore):
        self.le, self.store = le, store
        self.shaper_name = ""
        self.shaper_reason = ""
        self.lab = None  # backend remote: the connected lab hosts (testbed.remote.lab.Lab)

    def __enter__(self) -> "CellRunner":
        if self.le.experiment.backend == "remote":
            from testbed.remote.lab import open_for

            self.lab = open_for(self.le)
            try:
                self.shaper_name, self.shaper_reason = self.lab.shaper_choice(
                    self.le.experiment.shaper)
            except BaseException:
                self.lab.close()
                raise
        else:
            self.shaper_name, self.shaper_reason = netops.choose_shaper(
                self.le.experiment.shaper)
        log.info("shaper %s: %s", self.shaper_name, self.shaper_reason)
        return self

    def __exit__(self, *exc) -> None:
        if self.lab is not None:
            self.lab.close()
        return None

    def run(self, cell: Cell, repeat: int) -> dict[str, Any]:
        """Run one cell × repeat; always returns its row (status ok or failed)."""
        row = self._base_row(cell, repeat)
        cell_dir = self.store.cell_dir(cell.cell_id, repeat)
        t0 = time.monotonic()
        try:
            plan = _plan(cell)
            row["placement_stage_dcs"] = " ".join(plan.stage_dcs)
            row.update(_prediction(cell, plan))
            row.update(self._run(cell, repeat, cell_dir, plan))
            row["status"], row["error"] = "ok", ""
        except TestbedError as e:
            log.warning("cell %s failed: %s", cell.cell_id, e)
            row["status"], row["error"] = "failed", _one_line(str(e))
        row["duration_s"] = round(time.monotonic() - t0, 3)
        return row

    def _base_row(self, cell: Cell, repeat: int) -> dict[str, Any]:
        exp, w = cell.experiment, cell.experiment.workload
        return {
            "experiment": exp.name, "run_id": self.store.run_id, "cell_id": cell.cell_id,
            "repeat": repeat, "status": "failed", "error": "", **cell.params,
            "backend": exp.backend, "shaper": self.shaper_name, "placement": exp.placement,
            "schedule": w.schedule, "executor": w.executor, "compute_mode": w.compute.mode,
            "pp": w.parallel.pp, "dp": w.parallel.dp, "chunks": w.chunks,
            "microbatches": w.microbatches,
            "predicted_iteration_time_s": None, "predicted_bubble_ratio": None,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    def _run(self, cell: Cell, repeat: int, cell_dir: Path, plan: CellPlan) -> dict[str, Any]:
        exp = cell.experiment
        links = exp.topology.resolved_links(exp.links.inter_dc, exp.links.per_link)
        slots = plan.slots
        _write_cell_json(cell, repeat, self.store.run_id, plan, cell_dir)
        row: dict[str, Any] = {}
        with ExitStack() as stack:
            if self.lab is not None:
                net, shaper = self.lab.bring_up(exp, links, self.shaper_name, cell_dir / "net",
                                                stack)
            else:
                net, shaper = netops.network(exp, links, self.shaper_name, cell_dir / "net",
                                             stack)
            measured = netops.fidelity(net, exp.measure_links)
            for link in links:
                row.update(link_columns(link, measured[link.name]))
            procs = self._launch(net, cell, slots, cell_dir, stack)
            player = netops.start_steps(shaper, links, stack)
            netops.watch_workers(procs, exp.timeout_s, cell_dir, check=shaper.check_alive)
            player.stop()  # no step half-applied while shaping is read back
            shaper.verify()  # still as set at the end of the run (issue 16)
            row["delayline_drops"] = shaper.drops()
            row["queue_drops"] = shaper.queue_drops()
            _write_json(cell_dir / "steps.json", player.applied)
        row.update(netops.metrics_row(cell_dir, exp))
        return row

    def _launch(self, net, cell: Cell, slots: list[Slot], cell_dir: Path, stack: ExitStack):
        master = netops.host_of(net, slots[0])
        procs = {}
        for slot in slots:
            host = netops.host_of(net, slot)
            job = dict(RANK=str(slot.rank), WORLD_SIZE=str(len(slots)),
                       LOCAL_RANK="0", MASTER_ADDR=str(master.ip), MASTER_PORT=str(MASTER_PORT),
                       TESTBED_TIMEOUT_S=str(int(cell.experiment.timeout_s)))
            logf = open(cell_dir / f"worker-rank{slot.rank}.log", "wb")
            stack.callback(logf.close)
            procs[slot.rank] = net.start_worker(host, slot.rank, job, cell_dir, logf)
            stack.callback(netops.stop_process, procs[slot.rank])
        return procs


PREDICTED = ("predicted_iteration_time_s", "predicted_bubble_ratio", "predicted_exposed_comm_s",
             "predicted_peak_inflight")


def _plan(cell: Cell) -> CellPlan:
    """The cell's placement and schedule; a placement (SpecError) or schedule that cannot be
    built is the cell's failure, not a traceback."""
    try:
        return plan_cell(cell.experiment)
    except ValueError as e:
        raise TestbedError(f"cannot plan the cell: {e}") from None


def _prediction(cell: Cell, plan: CellPlan) -> dict[str, Any]:
    """The simulator's prediction for the cell (written beside what is measured); empty when
    the cell cannot be simulated (e.g. real compute without modelled times)."""
    from testbed.sim import predict
    try:
        got = predict(cell.experiment, plan=plan)
    except TestbedError as e:
        log.info("cell %s: no prediction: %s", cell.cell_id, e)
        return {}
    return {k: got[k] for k in PREDICTED if k in got}


def _write_cell_json(cell: Cell, repeat: int, run_id: str, plan: CellPlan,
                     cell_dir: Path) -> None:
    exp = cell.experiment
    data = {
        "cell_id": cell.cell_id, "run_id": run_id, "repeat": repeat, "params": cell.params,
        "workload": exp.workload.model_dump(mode="json"),
        "placement": [{"rank": s.rank, "pp_rank": s.pp_rank, "dp_rank": s.dp_rank, "dc": s.dc,
                       "host_index": s.host_index} for s in plan.slots],
        "schedule": plan.schedule.to_dict(),
        "experiment": exp.model_dump(mode="json"),
    }
    (cell_dir / "cell.json").write_text(json.dumps(data, indent=2), encoding="utf-8")


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


def _one_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-3:]) if lines else "unknown error"


def link_columns(link: ResolvedLink, measured: dict[str, float | None]) -> dict[str, Any]:
    """The CSV columns of one inter-DC link: configured and measured RTT and rate."""
    p = f"link_{link.name}_"
    rate = link.a_to_b.rate_mbit
    return {
        p + "rtt_ms_configured": link.a_to_b.one_way_delay_ms + link.b_to_a.one_way_delay_ms,
        p + "rtt_ms_measured": measured.get("rtt_ms"),
        p + "rtt_ms_p99_measured": measured.get("rtt_ms_p99"),
        p + "rate_mbit_configured": rate,
        p + "rate_mbit_measured": measured.get("rate_mbit"),
    }
