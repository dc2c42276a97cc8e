"""One cell's lifecycle: write the cell file → build → shape → verify → measure → launch →
watch → metrics → row → teardown (always, in reverse order of build, also on failure or
interrupt). The cell's plan is made before the sweep starts; nothing here re-plans."""
from __future__ import annotations

import json
import logging
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from testbed.errors import TestbedError
from testbed.launch.celldir import CellDir
from testbed.launch.supervise import watch_workers
from testbed.net.backends.base import Backend
from testbed.net.network import Network
from testbed.net.measure import LinkMeasurement, measure_link
from testbed.net.shaping.interface import Shaper
from testbed.net.steps import StepPlayer
from testbed.topology import ResolvedLink
from testbed.perfetto import export
from testbed.plan import CellPlan
from testbed.runner import columns
from testbed.runner.fidelity import CpuSampler, assess
from testbed.runner.measured import cell_metrics
from testbed.runner.series import measure
from testbed.runner.store import RunStore
from testbed.runner.tracewatch import IterationWatch
from testbed.runner.workers import start_workers

log = logging.getLogger(__name__)


class CellRunner:
    """Runs the planned cells of one experiment on one backend; a context manager so that the
    backend is opened and the shaper chosen once per sweep."""

    def __init__(self, backend: Backend, requested_shaper: str, store: RunStore):
        self.backend, self.requested_shaper, self.store = backend, requested_shaper, store
        self.shaper_name = ""

    def __enter__(self) -> "CellRunner":
        self.backend.open()
        try:
            self.shaper_name, reason = self.backend.shaper_choice(self.requested_shaper)
        except BaseException:
            self.backend.close()
            raise
        log.info("shaper %s: %s", self.shaper_name, reason)
        return self

    def __exit__(self, *exc) -> None:
        self.backend.close()

    def run(self, plan: CellPlan, repeat: int) -> dict[str, Any]:
        """Run one cell × repeat; always returns its row (status ok or failed)."""
        row = self._base_row(plan, repeat)
        t0 = time.monotonic()
        try:
            row.update(self._run(plan, repeat, CellDir(self.store.cell_dir(plan.cell.cell_id,
                                                                           repeat))))
            row["status"], row["error"] = "ok", ""
        except TestbedError as e:
            log.warning("cell %s failed: %s", plan.cell.cell_id, e)
            row["status"], row["error"] = "failed", _one_line(str(e))
        row["duration_s"] = round(time.monotonic() - t0, 3)
        return row

    def _base_row(self, plan: CellPlan, repeat: int) -> dict[str, Any]:
        cell, exp, w = plan.cell, plan.experiment, plan.experiment.workload
        return {
            "experiment": exp.name, "run_id": self.store.run_id, "cell_id": cell.cell_id,
            "repeat": repeat, "status": "failed", "error": "", **cell.params,
            "backend": exp.backend, "shaper": self.shaper_name, "placement": exp.placement,
            "placement_stage_dcs": " ".join(plan.stage_dcs),
            "schedule": w.schedule_file or w.schedule, "executor": w.executor,
            "compute_mode": w.compute.mode,
            "schedule_rule": plan.schedule.variant,  # crosspipe_greedy: the rule that won
            "pp": w.parallel.pp, "dp": w.parallel.dp, "chunks": w.chunks,
            "microbatches": w.microbatches,
            **{k: plan.prediction.get(k) for k in columns.PREDICTED},
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    def _run(self, plan: CellPlan, repeat: int, cell_dir: CellDir) -> dict[str, Any]:
        exp = plan.experiment
        plan.cell_file(self.store.run_id, repeat).write(Path(cell_dir.cell_file))
        row: dict[str, Any] = {}
        with ExitStack() as stack:
            net, shaper = self.backend.bring_up(plan.topology, plan.links, self.shaper_name,
                                                Path(cell_dir.net), stack)
            row.update(_measured_links(net, plan.links, exp.measure_links))
            t0 = time.monotonic()
            procs = start_workers(net, plan, cell_dir, stack)
            player = _start_steps(shaper, plan.links, stack,
                                  IterationWatch(Path(cell_dir.trace(0))).done)
            # a shaper that dies mid-run (a delay line) fails the cell at once, naming the link
            with CpuSampler() as cpu:  # the box's CPU over the workers' phase (fidelity)
                watch_workers(procs, exp.timeout_s, Path(cell_dir.root), check=shaper.check_alive)
            row["wall_time_s"] = round(time.monotonic() - t0, 3)
            player.stop()  # no step half-applied while shaping is read back
            shaper.verify()  # still as set at the end of the run
            row.update(_drops(shaper))
            _write_json(Path(cell_dir.steps), player.applied)
        row.update(_metrics(Path(cell_dir.root), plan, player))
        row.update(assess(Path(cell_dir.root), plan, row, cpu))
        export(Path(cell_dir.root))
        return row


def _measured_links(net: Network, links: list[ResolvedLink], measure: bool) -> dict[str, Any]:
    """The link columns of every inter-DC link: configured, and measured RTT (and rate, when
    the link is shaped) unless ``measure`` is off."""
    out: dict[str, Any] = {}
    for link in links:
        if measure:
            m = measure_link(net, link, rate=link.a_to_b.rate_mbit is not None).as_dict()
        else:
            m = LinkMeasurement(link.name, 0.0, None).as_dict()
        log.info("link %s measured: %s", link.name, m)
        out.update(columns.link_columns(link, m))
    return out


def _start_steps(shaper: Shaper, links: list[ResolvedLink], stack: ExitStack,
                 iterations) -> StepPlayer:
    """Start playing the links' time-varying steps; stopped (and its errors raised) on close."""
    player = StepPlayer(shaper, links, iterations=iterations)
    player.start()
    stack.callback(player.stop)
    return player


def _metrics(cell_dir: Path, plan: CellPlan, player: StepPlayer) -> dict[str, Any]:
    """The built-in worker's metrics with its per-iteration series (and the phased prediction
    of a cell with steps); a program's, as far as its traces or output allow
    (``metrics_source`` says how they were obtained)."""
    if plan.experiment.workload.program is None:
        return {**measure(cell_dir, plan, player), "metrics_source": "worker"}
    return cell_metrics(cell_dir, plan.experiment.workload)


def _drops(shaper: Shaper) -> dict[str, Any]:
    return {"delayline_drops": shaper.drops(), "queue_drops": shaper.queue_drops()}


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


def _one_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-3:]) if lines else "unknown error"
