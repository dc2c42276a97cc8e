"""Planning a whole sweep before anything is built: every cell planned, every failure listed.

Like containerlab's validate-all-first: a sweep in which any cell cannot be planned stops with
exit 2 (``SpecError``) naming each such cell, before a namespace or a process exists.
"""
from __future__ import annotations

import logging

from testbed.errors import Problem, SpecError, TestbedError
from testbed.plan.placement import capacity_problem
from testbed.plan.cellplan import CellPlan, plan_cell
from testbed.plan.phases import at_iteration_problem
from testbed.spec import Cell, LoadedExperiment
from testbed.topology import emulation_problems as topology_emulation_problems

log = logging.getLogger(__name__)


def capacity_problems(le: LoadedExperiment, cells: list[Cell] | None = None) -> list[Problem]:
    """Cells whose placement strategy cannot fit pp × dp ranks on the topology (cheap: no
    placement is solved); one Problem per cell."""
    out = []
    for c in cells if cells is not None else le.cells:
        w = c.experiment.workload
        why = capacity_problem(c.experiment.topology, w.parallel.pp, w.parallel.dp,
                               c.experiment.placement, w.ranks_per_host)
        why = why or at_iteration_problem(c.experiment)
        if why:
            out.append(problem_of(le, c, why))
    return out


def emulation_problems(le: LoadedExperiment, plans: list[CellPlan],
                       max_hosts_per_dc: int | None) -> list[Problem]:
    """Cells whose network the backend cannot build (``testbed.topology.emulation_problems``): what
    ``run`` refuses before building anything; prediction takes them."""
    return [problem_of(le, p.cell, why) for p in plans
            for why in topology_emulation_problems(p.topology, max_hosts_per_dc)]


def plan_all(le: LoadedExperiment, cells: list[Cell] | None = None) -> list[CellPlan]:
    """The plan of every cell (default: all of the experiment's), in order. Raises SpecError
    listing every cell that cannot be planned."""
    plans, problems = [], capacity_problems(le, cells)
    if problems:
        raise SpecError(problems)
    for c in cells if cells is not None else le.cells:
        try:
            plans.append(plan_cell(c))
        except SpecError as e:
            problems += [problem_of(le, c, p.message) for p in e.problems]
        except TestbedError as e:
            problems.append(problem_of(le, c, str(e)))
    if problems:
        raise SpecError(problems)
    return plans


def problem_of(le: LoadedExperiment, cell: Cell, message: str) -> Problem:
    return Problem(str(le.path), 0, 0, f"cell {cell.cell_id} ({cell.label})",
                   f"cannot be planned: {message}")
