"""A cell's plan: where every rank runs and the schedule it follows, computed once per cell.

The runner writes the plan into ``cell.json`` (placement and compute-only schedule); workers
run that schedule, and the simulator predicts the same plan. Cross-DC-aware schedules
(``geopipe``, ``crosspipe_greedy``, ``crosspipe_milp``) are built here from the cell's links
and compute times (``CrossDCContext``), after the placement has decided which stage boundaries
cross DCs; the MILP is therefore solved once, by the runner, not by every worker.
"""
from __future__ import annotations

from dataclasses import dataclass

from testbed.placement import LinkCost, PlacementProblem, Slot, place
from testbed.schedule.crossdc import Boundary, CrossDCContext
from testbed.schedule.generators import generate
from testbed.schedule.ir import Schedule
from testbed.schedule.registry import CROSS_DC_SCHEDULES
from testbed.spec import Experiment

# while CBA compares placements, the MILP (seconds each) stands in as its greedy cousin
_CANDIDATE_SCHEDULE = {"crosspipe_milp": "crosspipe_greedy"}


@dataclass
class CellPlan:
    """Slots ordered by global rank and the compute-only schedule (not lowered)."""

    slots: list[Slot]
    schedule: Schedule

    @property
    def stage_dcs(self) -> list[str]:
        """The DC of each pipeline stage (replica 0)."""
        return [s.dc for s in self.slots if s.dp_rank == 0]


def crossdc_context(exp: Experiment, slots: list[Slot]) -> CrossDCContext:
    """Boundary delays and serialization between consecutive stages of replica 0 (from the
    cell's network paths), one stage's F/B/W and ``workload.memory_limit``."""
    from testbed.sim.inputs import Network, message_bytes, stage_times

    w = exp.workload
    net, nbytes = Network(exp), message_bytes(w)
    t = stage_times(exp)[0]
    pipe = [s for s in slots if s.dp_rank == 0]
    bounds = {}
    for a, b in zip(pipe, pipe[1:]):
        there, back = net.path(a, b), net.path(b, a)
        bounds[a.pp_rank] = Boundary(
            1000 * max(there.delay_s, back.delay_s),
            1000 * max(there.serialization_s(nbytes), back.serialization_s(nbytes)))
    return CrossDCContext(t.f * 1000, t.b * 1000, t.w * 1000, bounds, w.memory_limit)


def schedule_for(exp: Experiment, slots: list[Slot], name: str | None = None) -> Schedule:
    """The compute-only schedule ``name`` (default: the workload's) for this placement."""
    w = exp.workload
    name = name or w.schedule
    ctx = crossdc_context(exp, slots) if name in CROSS_DC_SCHEDULES else None
    return generate(name, w.parallel.pp, w.microbatches, w.chunks, ctx)


def placement_problem(exp: Experiment) -> PlacementProblem:
    """The link costs and compute times the link-aware placements choose from; ``evaluate``
    is the simulator's iteration time with the cell's schedule."""
    from testbed.sim.engine import Path, simulate
    from testbed.sim.inputs import Network, build_input, message_bytes, stage_times

    w = exp.workload
    net = Network(exp)
    t = stage_times(exp)[0]

    def cost(a: str, b: str) -> LinkCost:
        p = net.path(Slot(0, 0, 0, a, 0), Slot(0, 0, 0, b, 1 if a == b else 0))
        return LinkCost(p.delay_s, p.rate_bps)

    def evaluate(slots: list[Slot]) -> float:
        name = _CANDIDATE_SCHEDULE.get(w.schedule, w.schedule)
        return simulate(build_input(exp, slots, schedule_for(exp, slots, name))).span_s

    return PlacementProblem(
        exp.network_topology(), w.parallel.pp, w.parallel.dp, w.microbatches, t.f, t.b,
        message_bytes(w), cost, lambda n, c: Path((), c.rate_bps, c.delay_s).serialization_s(n),
        evaluate)


def plan_cell(exp: Experiment) -> CellPlan:
    """Placement, then the schedule for it. Raises SpecError (placement) or ValueError
    (compute times unknown, a schedule that cannot be built)."""
    w = exp.workload
    slots = place(exp.placement, exp.topology, w.parallel.pp, w.parallel.dp,
                  lambda: placement_problem(exp))
    return CellPlan(slots, schedule_for(exp, slots))
