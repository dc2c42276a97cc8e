"""The sweep: every cell × repeat in order, each row on disk before the next cell starts.

A failed cell is recorded and the sweep goes on; Ctrl-C (or SIGTERM) tears the current cell
down and stops with finished rows intact; ``--resume`` skips the cells that already have an
``ok`` row (failed ones run again and their row is replaced).
Every cell is planned before the first network is built: a sweep with any cell that cannot
be planned stops with exit 2 (every such cell listed) and builds nothing.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

from testbed.errors import (EXIT_CELLS_FAILED, EXIT_OK, Problem, SpecError, StorageError,
                            writing)
from testbed.launch.interpreters import Interpreters, uses_torch_executor
from testbed.net.backends import backend_class, experiment_backend
from testbed.plan import CellPlan, emulation_problems, plan_all
from testbed.runner.cell import CellRunner
from testbed.runner.control import run_controls
from testbed.runner.store import RunStore
from testbed.spec import Cell, LoadedExperiment

log = logging.getLogger(__name__)


@dataclass
class RunOptions:
    results: Path = Path("results")
    resume: Path | None = None
    only: list[str] = field(default_factory=list)
    quiet: bool = False
    cold: bool = False  # every cell from scratch (see CellRunner)


class Interrupted(Exception):
    """SIGTERM/SIGINT arrived; the current cell is torn down and the sweep stops."""


def select_cells(le: LoadedExperiment, only: list[str]) -> list[Cell]:
    """The cells to run: all, or those named in ``only``; raises SpecError for unknown ids."""
    if not only:
        return le.cells
    known = {c.cell_id: c for c in le.cells}
    unknown = [c for c in only if c not in known]
    if unknown:
        raise SpecError([Problem(str(le.path), 0, 0, "--only", f"unknown cell id {u!r}; "
                                 f"`plan` lists the ids") for u in unknown])
    return [known[c] for c in only]


def open_store(le: LoadedExperiment, opts: RunOptions) -> RunStore:
    """A new run directory, or the one being resumed (which must be of the same experiment)."""
    if opts.resume is None:
        return RunStore.create(opts.results, le.experiment.name, le.path)
    store = RunStore.open(opts.resume)
    if store.experiment != le.experiment.name:
        raise SpecError([Problem(str(opts.resume), 0, 0, "--resume", f"run directory belongs to "
                                 f"experiment {store.experiment!r}, not {le.experiment.name!r}")])
    return store


@contextmanager
def _signals_as_interrupt() -> Iterator[None]:
    owner = os.getpid()

    def handler(signum, frame):
        if os.getpid() != owner:
            # a forked helper (pyroute2 forks to enter namespaces) inherited this handler: it
            # must simply die as asked, not unwind the runner's code in the child
            os._exit(128 + signum)
        raise Interrupted(signal.Signals(signum).name)
    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class _RunLogHandler(logging.FileHandler):
    """run.log. A write that fails (a full disk) ends the log with one warning on stderr,
    instead of logging's traceback for every record after it; the run goes on."""

    failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        if self.failed:
            return
        self.failed = True
        e = sys.exc_info()[1]
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        sys.stderr.write(f"warning: cannot write {self.baseFilename}: {reason}; the run goes "
                         "on without its log\n")


def _open_run_log(store: RunStore) -> logging.Handler:
    path = store.root / "run.log"
    with writing(path):
        return _RunLogHandler(path)


@contextmanager
def _run_log(handler: logging.Handler) -> Iterator[None]:
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(min(old_level or logging.WARNING, logging.INFO))
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        handler.close()


def run_experiment(le: LoadedExperiment, opts: RunOptions,
                   console: Console) -> tuple[int, RunStore]:
    """Run (or resume) a loaded experiment; returns (exit code, store).

    Exit code 0 when every row is ok, 1 when some cell failed. Raises SpecError for bad input
    (including cells that cannot be planned: nothing is built then), MachineError when the
    machine cannot run it, StorageError when results cannot be written (exit 3 before the
    sweep, 1 during it: the sweep stops, the network is torn down, rows written stay),
    Interrupted when stopped by a signal.
    """
    plans = plan_all(le, select_cells(le, opts.only))
    exp = le.experiment
    too_big = emulation_problems(le, plans, backend_class(exp.backend).max_hosts_per_dc)
    if too_big:
        raise SpecError(too_big)
    try:  # nothing has run yet: a results directory that cannot be written is exit 3
        store = open_store(le, opts)
        store.write_json("resolved.json", {p.cell.cell_id: resolved(p) for p in plans})
        log_handler = _open_run_log(store)
    except StorageError as e:
        raise e.before_run() from e
    todo = [(p, r) for p in plans for r in range(exp.repeat)
            if (p.cell.cell_id, r) not in store.finished()]
    console.print(f"run [bold]{store.root}[/]: {len(todo)} of {len(plans) * exp.repeat} "
                  f"cell runs to do")
    try:
        with _run_log(log_handler), _signals_as_interrupt(), \
                nullcontext() if opts.cold else Interpreters(
                    sys.executable, uses_torch_executor(p.experiment.workload for p, _ in todo)
                ) as interpreters:
            # before any network exists (a program interpreter is started only for a
            # control run that forks its ranks): nothing else of the harness runs
            controls = run_controls([p for p, _ in todo], store.root,
                                    say=lambda m: console.print(m, highlight=False),
                                    interpreters=interpreters)
            built_in = any(p.experiment.workload.program is None for p, _ in todo)
            with CellRunner(experiment_backend(exp, Path(le.path).parent), exp.shaper, store,
                            warm=not opts.cold, controls=controls, interpreters=interpreters,
                            built_in=built_in) as runner:
                _sweep(todo, runner, store, console, opts.quiet)
    except StorageError as e:  # the network is down (the runner's exit); rows so far kept
        raise e.with_hint(f"{store.csv_path} keeps the rows written before; continue with "
                          f"--resume {store.root}") from e
    finally:  # under sudo: run.log, net/ files and cells of a stopped sweep are the user's too
        store.hand_over()
    failed = [r for r in store.rows if r.get("status") != "ok"]
    return (EXIT_CELLS_FAILED if failed else EXIT_OK), store


def resolved(plan: CellPlan) -> dict:
    """What resolved.json keeps of a cell: its parameters, the resolved experiment, the
    placement and the prediction."""
    return {"params": plan.cell.params,
            "experiment": plan.experiment.model_dump(mode="json"),
            "placement_stage_dcs": plan.stage_dcs, "placement_map": plan.grid,
            "prediction": plan.prediction}


def _sweep(todo: list[tuple[CellPlan, int]], runner: CellRunner, store: RunStore,
           console: Console, quiet: bool) -> None:
    plain = quiet or not console.is_terminal
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                        console=console, disable=plain)
    with progress:
        task = progress.add_task("cells", total=len(todo))
        started = time.monotonic()
        for i, (plan, repeat) in enumerate(todo):
            progress.update(task, description=f"[{plan.cell.cell_id}] {plan.cell.label}")
            t0 = time.monotonic()
            row = runner.run(plan, repeat)
            store.put(row)
            eta = eta_text(time.monotonic() - started, i + 1, len(todo))
            msg = _one_line(i, len(todo), plan.cell, repeat, row, time.monotonic() - t0, eta)
            log.info(msg)
            if plain and not quiet:
                console.print(msg, highlight=False, soft_wrap=True)
            elif not plain:
                progress.console.print(msg, highlight=False, soft_wrap=True)
            progress.advance(task)


def eta_text(elapsed_s: float, done: int, total: int) -> str:
    """The sweep's estimated time left: the mean time per cell run so far times the runs
    left ('sweep done' after the last)."""
    left = total - done
    if left <= 0:
        return "sweep done"
    eta = round(elapsed_s / done * left)
    return f"ETA {eta // 3600}h{eta // 60 % 60:02d}m" if eta >= 3600 else \
        f"ETA {eta // 60}m{eta % 60:02d}s"


def _one_line(i: int, n: int, cell: Cell, repeat: int, row: dict, seconds: float,
              eta: str) -> str:
    """The progress line (ending with the sweep's ``eta``), then a WARNING line per reason
    the cell's fidelity is degraded."""
    head = f"[{i + 1}/{n}] {cell.cell_id} {cell.label}" + (f" repeat {repeat}" if repeat else "")
    if row["status"] != "ok":
        return f"{head}: FAILED after {seconds:.1f} s: {row.get('error')}; {eta}"
    parts = [text.format(row[k]) for k, text in _PROGRESS if row.get(k) is not None]
    measured = ", ".join(parts) or f"no metrics ({row.get('metrics_source')})"
    fidelity = str(row.get("fidelity") or "")
    # one line per reason under the progress line: each stays within a 120-column log
    reasons = fidelity.removeprefix("degraded: ").split("; ") \
        if fidelity.startswith("degraded") else []
    warn = "".join(f"\n  WARNING fidelity degraded: {r}" for r in reasons)
    return f"{head}: {measured} ({seconds:.1f} s); {eta}{warn}"


# the metrics of the progress line; a program's cell may have only some (or none) of them
_PROGRESS = [("iteration_time_s", "iteration {:.3f} s"), ("bubble_ratio", "bubble {:.3f}"),
             ("throughput_tokens_s", "{:.0f} tokens/s")]
