"""Predicting every cell of a sweep, on every core, each distinct plan once.

``predict_cells`` plans and simulates each cell (``plan_cell``), in worker processes forked
from this one when there are several cells and cores. Cells that differ only in what no
prediction reads (the file's name and description, repeats, the timeout) share one
simulation: their ``plan_key`` is the same.
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
from typing import Any, Callable

from testbed.errors import SpecError, TestbedError
from testbed.plan.cellplan import plan_cell
from testbed.plan.sweep import capacity_problems, problem_of
from testbed.sim import SimulationError
from testbed.spec import Cell, LoadedExperiment

# what no plan or prediction reads
_NOT_PLANNED = {"name", "description", "matrix", "repeat", "timeout_s"}

Progress = Callable[[int, int], None]  # (cells done, cells in all)


def plan_key(cell: Cell) -> str:
    """Equal for cells whose plans (and so predictions) are equal."""
    resolved = cell.experiment.model_dump(mode="json", exclude=_NOT_PLANNED)
    path = cell.experiment.workload.schedule_path
    if path is not None and path.is_file():
        resolved["schedule_file"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashlib.sha256(json.dumps(resolved, sort_keys=True).encode()).hexdigest()


Outcome = tuple[dict[str, Any] | None, str, bool]  # (row or None, why not, planned)


def _predict_one(cell: Cell) -> Outcome:
    """(the cell's predicted columns and schedule_rule, or None; why not; whether it was
    planned at all)."""
    try:
        plan = plan_cell(cell)
    except SpecError as e:
        return None, "; ".join(p.message for p in e.problems), False
    except TestbedError as e:
        return None, str(e), False
    if not plan.prediction:
        return None, f"no prediction: {plan.prediction_note}", True
    return {**plan.prediction, "schedule_rule": plan.schedule.variant}, "", True


_CELLS: list[Cell] = []  # the cells of the running sweep, as the forked workers see them


def _work(i: int) -> tuple[int, Outcome]:
    return i, _predict_one(_CELLS[i])


def predict_cells(le: LoadedExperiment, jobs: int | None = None,
                  progress: Progress | None = None) -> list[dict[str, Any]]:
    """Every cell's row: ``cell_id``, its swept values, the ``predicted_*`` columns and
    ``schedule_rule``, in cell order. ``jobs`` worker processes (default: one per core).
    Raises SpecError naming every cell that cannot be planned, SimulationError for a cell
    that cannot be simulated."""
    problems = capacity_problems(le)
    if problems:
        raise SpecError(problems)
    keys = [plan_key(cell) for cell in le.cells]
    firsts: dict[str, int] = {}
    for i, key in enumerate(keys):
        firsts.setdefault(key, i)
    found = _compute(le.cells, sorted(firsts.values()), jobs or os.cpu_count() or 1, progress)
    failed = [(le.cells[i], why, planned) for i, (row, why, planned) in found.items()
              if row is None]
    unplanned = [problem_of(le, c, why) for c, why, planned in failed if not planned]
    if unplanned:
        raise SpecError(unplanned)
    if failed:
        cell, why, _ = failed[0]
        raise SimulationError(f"cell {cell.cell_id} ({cell.label}): {why}")
    return [{"cell_id": cell.cell_id, **cell.params, **found[firsts[key]][0]}
            for cell, key in zip(le.cells, keys)]


def _compute(cells: list[Cell], todo: list[int], jobs: int,
             progress: Progress | None) -> dict[int, Outcome]:
    out: dict[int, Outcome] = {}
    if jobs < 2 or len(todo) < 2:
        for n, i in enumerate(todo, 1):
            out[i] = _predict_one(cells[i])
            if progress:
                progress(n, len(todo))
        return out
    global _CELLS
    _CELLS = cells
    try:
        with multiprocessing.get_context("fork").Pool(min(jobs, len(todo))) as pool:
            for n, (i, outcome) in enumerate(pool.imap_unordered(_work, todo), 1):
                out[i] = outcome
                if progress:
                    progress(n, len(todo))
    finally:
        _CELLS = []
    return out
