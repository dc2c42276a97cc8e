"""One cell's lifecycle: write the cell file → network (kept from the cell before when the
topology is the same, see ``livenet``) → shape → read back → probe the links → launch the
ranks (``testbed.launch``) → watch → read the traces into the row (``testbed.readout``). The
network is torn down when the topology changes, after a failed cell, and at the end of the
sweep (always, also on interrupt). The cell's plan is made before the sweep starts; nothing
here re-plans.

Ranks on this machine are forked from pre-started interpreters (``testbed.launch.interpreters``:
the built-in worker's, and one for ``python …`` programs), so the import of torch is paid once
per sweep, not per rank and cell; ranks on lab hosts start as processes of their own.

Every process the runner started is watched while a cell runs (``_check_parts``: the rank
interpreter, the shaper's delay lines; the ranks in ``watch_workers``; the link probes through
``watch``): one that dies fails the cell within a poll, and its error names it, whatever else
failed because of it. The next cell gets a new interpreter and a new network."""
from __future__ import annotations

import json
import logging
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from testbed.cell.celldir import CellDir
from testbed.errors import RefusedError, StorageError, TestbedError, writing
from testbed.launch.interpreters import Interpreters
from testbed.launch.rdma import unshaped_rdma_hosts
from testbed.launch.supervise import watch_workers
from testbed.launch.workers import start_workers
from testbed.net.backends.base import Backend
from testbed.net.shaping.interface import Shaper
from testbed.net.steps import StepPlayer
from testbed.net.wiresampler import WireSampler
from testbed.plan import CellPlan
from testbed.plan.grid import grid_text
from testbed.readout.nccl import nccl_columns
from testbed.runner.controller import controller_columns, start_controller
from testbed.readout import columns
from testbed.readout.control import control_columns
from testbed.readout.dataparallel import dp_columns
from testbed.readout.cpu import CpuSampler
from testbed.readout.fidelity import assess
from testbed.readout.perfetto import export
from testbed.readout.program import program_metrics
from testbed.readout.series import metrics_and_series, series_csv
from testbed.runner.livenet import LiveNetwork
from testbed.runner.store import RunStore, atomic_write
from testbed.runner.tracewatch import IterationWatch
from testbed.topology import ResolvedLink

log = logging.getLogger(__name__)


class CellRunner:
    """Runs the planned cells of one experiment on one backend; a context manager so that the
    backend is opened and the shaper chosen once per sweep. ``warm`` (the default) keeps the
    network, the pre-started interpreter and link measurements across cells; without it every
    cell starts from scratch (a new network, a process per rank, links measured again).
    ``interpreters`` (made here when not given, and closed on exit) start only when a cell
    uses them, except the built-in worker's, started at once (its import overlapping the
    first network's build) unless ``built_in`` says no cell runs the built-in worker."""

    def __init__(self, backend: Backend, requested_shaper: str, store: RunStore,
                 warm: bool = True, controls: dict[str, dict] | None = None,
                 interpreters: Interpreters | None = None, built_in: bool = True):
        self.backend, self.requested_shaper, self.store = backend, requested_shaper, store
        self.controls = controls or {}  # programs' control runs (testbed.runner.control)
        self.shaper_name = ""
        self.warm, self.built_in = warm, built_in
        self.pool = (interpreters or Interpreters(sys.executable)) if warm else None
        self.live: LiveNetwork | None = None

    def __enter__(self) -> "CellRunner":
        self.backend.open()
        try:
            self.shaper_name, reason = self.backend.shaper_choice(self.requested_shaper)
        except BaseException:
            self.backend.close()
            raise
        log.info("shaper %s: %s", self.shaper_name, reason)
        self.live = LiveNetwork(self.backend, self.shaper_name)
        if self.backend.hosts_here and self.pool is not None and self.built_in:
            self.pool.worker.warm()  # torch's import overlaps building the first network
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.live.close()
            if self.pool is not None:
                self.pool.close()
        finally:
            self.backend.close()

    def run(self, plan: CellPlan, repeat: int) -> dict[str, Any]:
        """Run one cell × repeat; returns its row (status ok or failed). Raises StorageError
        when the cell's files cannot be written (a full disk): no later cell could record its
        results either, so the sweep stops (the network is torn down on the runner's exit).
        Raises RefusedError, and stops the sweep the same way, when NCCL could carry the cell's
        traffic over RDMA, unshaped, and the experiment did not opt in (exit 2)."""
        row = self._base_row(plan, repeat)
        t0 = time.monotonic()
        if self.pool is not None:
            self.pool.begin_cell()  # a dead interpreter is replaced when the cell uses it
        try:
            row.update(self._run(plan, repeat, CellDir(self.store.cell_dir(plan.cell.cell_id,
                                                                           repeat)), row))
            row["status"], row["error"] = "ok", ""
        except StorageError:
            raise
        except RefusedError as e:  # the sweep stops: run.log says why, as the console does
            log.error("%s", e)
            raise
        except TestbedError as e:
            error, dead = str(e), self._dead_part()
            if dead is not None and str(dead) not in error:  # the part that died comes first
                error = f"{dead}; also: {error}"
            log.warning("cell %s failed: %s", plan.cell.cell_id, error)
            row["status"], row["error"] = "failed", _one_line(error)
            self.live.close()  # the next cell starts on a fresh network
        if not self.warm:
            self.live.close()
        row["duration_s"] = round(time.monotonic() - t0, 3)
        return row

    def _base_row(self, plan: CellPlan, repeat: int) -> dict[str, Any]:
        cell, exp, w = plan.cell, plan.experiment, plan.experiment.workload
        return {
            "experiment": exp.name, "run_id": self.store.run_id, "cell_id": cell.cell_id,
            "repeat": repeat, "status": "failed", "error": "", **cell.params,
            "backend": exp.backend, "shaper": self.shaper_name, "unshaped_rdma_hosts": "",
            "placement": exp.placement_name,
            "placement_stage_dcs": " ".join(plan.stage_dcs),
            **_data_parallel_settings(plan),
            "schedule": w.schedule_file or w.schedule, "executor": w.executor,
            "compute_mode": w.compute.mode,
            "schedule_rule": plan.schedule.variant,  # crosspipe_greedy: the rule that won
            "pp": w.parallel.pp, "dp": w.parallel.dp, "chunks": w.chunks,
            "microbatches": w.microbatches,
            **{k: plan.prediction.get(k) for k in columns.PREDICTED},
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    def _check_parts(self) -> None:
        """Cheap, polled while a cell runs: raises the error naming a part this runner started
        that died (a rank interpreter the cell's ranks come from, a delay line)."""
        if self.pool is not None:
            self.pool.check_alive()
        if self.live.shaper is not None:
            self.live.shaper.check_alive()

    def _dead_part(self) -> TestbedError | None:
        """The error naming a part that died (see ``_check_parts``); None while all run."""
        try:
            self._check_parts()
        except TestbedError as e:
            return e
        return None

    def _run(self, plan: CellPlan, repeat: int, cell_dir: CellDir,
             marks: dict[str, Any]) -> dict[str, Any]:
        """The cell's measured columns; ``marks`` (its row) is told at once which hosts run
        NCCL on RDMA, unshaped, so that the row says so even if the cell fails later."""
        exp = plan.experiment

        check = self._check_parts
        with writing(cell_dir.cell_file):
            plan.cell_file(self.store.run_id, repeat).write(Path(cell_dir.cell_file))
        clock = _Phases()
        net, shaper = self.live.acquire(plan, Path(cell_dir.net))
        marks["unshaped_rdma_hosts"] = " ".join(unshaped_rdma_hosts(net, plan))  # or refused
        marks.update(net.row_notes())
        clock.mark("network")
        row: dict[str, Any] = {"network": net.tag}
        check()
        row.update(self.live.measured_links(plan, f"{plan.cell.cell_id}/{repeat}", check))
        drops_before, sent_before = _drops(shaper), shaper.tx_counters()
        clock.mark("links")
        row["network_setup_s"], row["measure_links_s"] = (round(s, 3) for _, s in clock.spent)
        with ExitStack() as stack:
            t0 = time.monotonic()
            ctl = start_controller(shaper, plan, cell_dir, stack)  # its rates before rank 0
            procs = start_workers(net, plan, cell_dir, stack, self.pool)
            player = _start_steps(shaper, plan.links, stack,
                                  IterationWatch(Path(cell_dir.trace(0))).done)
            # a part that dies mid-run (a delay line, the interpreter) fails the cell at once
            # the box's CPU over the workers' phase (fidelity); each link direction's bytes
            with CpuSampler() as cpu, WireSampler(shaper.counter_namespaces()) as wire:
                exits = watch_workers(procs, exp.timeout_s, Path(cell_dir.root), check=check,
                                      finished=_finished(plan, cell_dir))
            row["wall_time_s"] = round(time.monotonic() - t0, 3)
            player.stop()  # no step half-applied while shaping is read back
            ctl and ctl.stop()
            shaper.verify()  # still as set at the end of the run
            row.update(_drops(shaper, drops_before))
            sent_after = shaper.tx_counters()
            _write_json(Path(cell_dir.steps), player.applied)
            clock.mark("workers")
        clock.mark("stop")
        row.update(_metrics(cell_dir, plan, player, exits, wire))
        row.update(dp_columns(plan, Path(cell_dir.root), sent_before, sent_after, not exits))
        row.update(control_columns(plan, self.controls, row, Path(cell_dir.root)))
        row.update(nccl_columns(plan, Path(cell_dir.root)))
        row.update(controller_columns(ctl, plan, cell_dir))
        row.update(assess(Path(cell_dir.root), plan, row, cpu, self.backend.hosts_here))
        with writing(cell_dir.perfetto):
            export(Path(cell_dir.root))
        clock.mark("metrics")
        check()  # a part that died at any moment of the cell fails it
        log.info("cell %s/%d took %s", plan.cell.cell_id, repeat, clock)
        return row


class _Phases:
    """Seconds spent in each named phase of a cell (for the run log)."""

    def __init__(self) -> None:
        self.last, self.spent = time.monotonic(), []

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.spent.append((name, now - self.last))
        self.last = now

    def __str__(self) -> str:
        return ", ".join(f"{name} {s:.2f} s" for name, s in self.spent)


def _start_steps(shaper: Shaper, links: list[ResolvedLink], stack: ExitStack,
                 iterations) -> StepPlayer:
    """Start playing the links' time-varying steps; stopped (and its errors raised) on close."""
    player = StepPlayer(shaper, links, iterations=iterations)
    player.start()
    stack.callback(player.stop)
    return player


def _metrics(cell_dir: CellDir, plan: CellPlan, player: StepPlayer,
             exit_notes: dict[int, str], wire: WireSampler) -> dict[str, Any]:
    """The built-in worker's metrics (with the phased prediction of a cell with steps); a
    program's, as far as its traces or output allow (``metrics_source`` says how they were
    obtained), with what its ranks did at exit. The per-iteration series, where there is one,
    is kept in the cell directory (iterations.csv)."""
    root = Path(cell_dir.root)
    if plan.experiment.workload.program is None:
        out, series = metrics_and_series(root, plan, player, wire=wire)
        out["metrics_source"] = "worker"
    else:
        out, series = program_metrics(root, plan, player, finished=not exit_notes, wire=wire)
        notes = "; ".join(f"rank {r} {why}" for r, why in sorted(exit_notes.items()))
        out["exit_status"] = notes or "ok"
    if series is not None:
        atomic_write(Path(cell_dir.iterations), series_csv(series))
    return out


def _finished(plan: CellPlan, cell_dir: CellDir):
    """For a program's cell: which ranks have traced all ``workload.iterations`` iterations
    (read from their traces as they grow, on this machine); None for the built-in worker."""
    if plan.experiment.workload.program is None:
        return None
    want = plan.experiment.workload.iterations
    watches = {s.rank: IterationWatch(Path(cell_dir.trace(s.rank))) for s in plan.slots}
    return lambda: {r for r, w in watches.items() if w.done() >= want}


def _drops(shaper: Shaper, before: dict[str, Any] | None = None) -> dict[str, Any]:
    """The shaper's drop and late-release counters; with ``before``, what they counted since
    then (a network kept across cells keeps counting)."""
    late, releases = shaper.releases() or (None, None)
    now = {"delayline_drops": shaper.drops(), "queue_drops": shaper.queue_drops(),
           "delayline_late_releases": late, "delayline_releases": releases}
    if before is None:
        return now
    return {k: v if v is None or before.get(k) is None else max(0, v - before[k])
            for k, v in now.items()}


def _write_json(path: Path, data: Any) -> None:
    with writing(path):
        path.write_text(json.dumps(data, indent=2), encoding="utf-8")


def _one_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-3:]) if lines else "unknown error"


def _data_parallel_settings(plan: CellPlan) -> dict[str, Any]:
    """With dp > 1: the DC of every (replica, stage) and the all-reduce's algorithm (the
    columns appear only when some cell has data parallelism)."""
    w = plan.experiment.workload
    if w.parallel.dp == 1:
        return {}
    return {"placement_map": grid_text(plan.grid), "gradient_sync": w.gradient_sync.algorithm}
