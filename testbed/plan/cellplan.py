"""A cell's plan: everything about one cell that can be known before anything is built.

``plan_cell`` computes it once per cell, without root and without torch: the topology as built
(``links.intra_dc`` laid over every DC's host links), the resolved inter-DC links and the paths
between hosts, the emulated compute times and message sizes, where every rank runs, the
compute-only schedule (cross-DC-aware schedules are built here from the placed links, so the
MILP is solved once per cell, not per repeat or per worker) and the simulator's prediction.
The runner, the cell file, the simulator and the report read it; nothing rebuilds it from the
experiment.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from testbed.errors import MachineError, TestbedError
from testbed.cell.cellfile import CellFile
from testbed.topology import Slot
from testbed.topology import ResolvedLink, Topology, emulation_problems
from testbed.plan.outer import grad_numel, outer_prediction
from testbed.plan.placement import LinkCost, PlacementProblem, place
from testbed.plan.sharing import start_offsets
from testbed.schedule.crossdc import Boundary, CrossDCContext
from testbed.schedule.csvfile import load_py, read_csv
from testbed.schedule.filecheck import Shape
from testbed.schedule.generators import generate
from testbed.schedule.ir import Schedule
from testbed.schedule.registry import CROSS_DC_SCHEDULES
from testbed.sim import SimulationError, predicted, run
from testbed.sim import calibration as C
from testbed.sim.engine import simulate
from testbed.sim.iteration import Path, SimInput, StageTimes
from testbed.sim.inputs import build_input, collective_steps
from testbed.sim.paths import PathModel
from testbed.spec import Cell, Experiment
from testbed.spec.costs import message_bytes, stage_times

log = logging.getLogger(__name__)

# while CBA compares placements, the MILP (seconds each) stands in as its greedy cousin
_CANDIDATE_SCHEDULE = {"crosspipe_milp": "crosspipe_greedy"}


class PlanError(TestbedError):
    """A cell cannot be planned: no placement, a schedule that cannot be built, unknown
    compute times."""


@dataclass(frozen=True)
class Costs:
    """The workload's modelled costs on this cell: compute times per virtual stage (s per
    microbatch) and bytes per activation message."""

    times: list[StageTimes]
    message_bytes: int

    @property
    def first(self) -> StageTimes:
        return self.times[0]


@dataclass
class CellPlan:
    """One cell, planned. ``prediction`` holds the ``predicted_*`` columns (empty, with the
    reason in ``prediction_note``, when the cell cannot be simulated)."""

    cell: Cell
    topology: Topology
    links: list[ResolvedLink]
    paths: PathModel
    costs: Costs | None
    slots: list[Slot]
    schedule: Schedule
    prediction: dict[str, Any] = field(default_factory=dict)
    prediction_note: str = ""
    start_offsets: dict[int, float] = field(default_factory=dict)  # wan_sharing: temporal
    # diloco/streaming: each measured iteration's predicted time (inner and sync steps differ)
    iteration_predictions: dict[int, float] = field(default_factory=dict)

    @property
    def experiment(self) -> Experiment:
        return self.cell.experiment

    @property
    def stage_dcs(self) -> list[str]:
        """The DC of each pipeline stage (replica 0)."""
        return [s.dc for s in self.slots if s.dp_rank == 0]

    @property
    def grid(self) -> list[list[str]]:
        """The DC of every (replica, stage): ``grid[d][s]`` (``testbed.plan.grid``)."""
        pp = self.experiment.workload.parallel.pp
        return [[s.dc for s in self.slots[d * pp:(d + 1) * pp]]
                for d in range(len(self.slots) // pp)]

    def sim_input(self) -> SimInput:
        """The simulator's input for this plan; raises SimulationError when the compute times
        are unknown (real compute without modelled times)."""
        if self.costs is None:
            raise SimulationError("no modelled compute times: give workload.compute.forward_ms "
                                  "and backward_ms (or a device)")
        inp = _sim_input(self.experiment, self.paths, self.costs, self.slots, self.schedule)
        inp.start_offsets = dict(self.start_offsets)
        if self.experiment.workload.parallel.dp > 1 and \
                hosts_on_this_machine(self.experiment.backend, self.topology):
            inp.host_bytes_per_s = C.HOST_UNSHAPED_BYTES_PER_S
        return inp

    def cell_file(self, run_id: str = "", repeat: int = 0) -> CellFile:
        """The cell file every worker of this cell reads."""
        return CellFile(cell_id=self.cell.cell_id, run_id=run_id, repeat=repeat,
                        params=self.cell.params, workload=self.experiment.workload,
                        placement=self.slots, schedule=self.schedule.to_dict(),
                        start_offsets_s=self.start_offsets)


def hosts_on_this_machine(backend: str, topology: Topology) -> bool:
    """Whether the backend would build this topology's hosts as processes of this one machine
    (``Backend.hosts_here``, and ``run`` could build it: ``emulation_problems``), so that their
    unshaped transfers share its CPUs. A what-if beyond one box is predicted without: it never
    runs here. So is a backend whose packages are missing here."""
    from testbed.net.backends import backend_class  # the backend's module only for dp > 1
    try:
        cls = backend_class(backend)
    except MachineError:
        return False
    return cls.hosts_here and not emulation_problems(topology, cls.max_hosts_per_dc)


def _sim_input(exp: Experiment, paths: PathModel, c: Costs, slots: list[Slot],
               schedule: Schedule) -> SimInput:
    w = exp.workload
    dp, sync = w.parallel.dp, w.gradient_sync
    steps = {}
    if dp > 1 and not sync.outer:  # outer syncs: testbed.plan.outer adds them per iteration
        steps = collective_steps(slots, schedule, grad_numel(w, schedule.n_stages),
                                 sync.algorithm, sync.bucket_numel)
    return build_input(paths, slots, schedule, c.times, c.message_bytes, dp, steps,
                       sync.overlap)


def crossdc_context(exp: Experiment, paths: PathModel, c: Costs,
                    slots: list[Slot]) -> CrossDCContext:
    """Boundary delays and serialization between consecutive stages of replica 0 (from the
    cell's paths), one stage's F/B/W, ``workload.memory_limit``, and the simulator of this cell
    as the judge between candidate schedules (the greedy's two selection rules)."""
    pipe = [s for s in slots if s.dp_rank == 0]
    bounds = {}
    for a, b in zip(pipe, pipe[1:]):
        there, back = paths.path(a, b), paths.path(b, a)
        bounds[a.pp_rank] = Boundary(
            1000 * max(there.delay_s, back.delay_s),
            1000 * max(there.serialization_s(c.message_bytes),
                       back.serialization_s(c.message_bytes)))
    t = c.first
    return CrossDCContext(t.f * 1000, t.b * 1000, t.w * 1000, bounds,
                          exp.workload.memory_limit,
                          evaluate=lambda s: simulate(_sim_input(exp, paths, c, slots, s)).span_s)


def schedule_for(exp: Experiment, paths: PathModel, c: Costs, slots: list[Slot],
                 name: str | None = None) -> Schedule:
    """The compute-only schedule ``name`` (default: the workload's) for this placement;
    raises PlanError when a cross-DC schedule lacks the compute times it is built from."""
    w = exp.workload
    if name is None and w.schedule_path is not None:
        return _schedule_from_file(exp, paths, c, slots)
    name = name or w.schedule
    ctx = None
    if name in CROSS_DC_SCHEDULES:
        ctx = crossdc_context(exp, paths, _known(c, name), slots)
    return generate(name, w.parallel.pp, w.microbatches, w.chunks, ctx)


def _schedule_from_file(exp: Experiment, paths: PathModel, c: Costs | None,
                        slots: list[Slot]) -> Schedule:
    """The workload's ``schedule_file``: a CSV as written, or what the .py file's function
    returns for this cell (given the cross-DC context when the compute times are known).
    Raises ScheduleFileError (a ValueError) when it is not a valid schedule."""
    w = exp.workload
    shape = Shape(w.parallel.pp, w.chunks, w.microbatches, w.memory_limit)
    if w.schedule_path.suffix.lower() == ".py":
        ctx = crossdc_context(exp, paths, c, slots) if c is not None else None
        return load_py(w.schedule_path, shape, ctx, name=w.schedule)
    return read_csv(w.schedule_path, shape, name=w.schedule)


def _known(c: Costs | None, what: str) -> Costs:
    if c is None:
        raise PlanError(f"{what} is computed from modelled compute times: give "
                        "workload.compute.forward_ms and backward_ms (or a device)")
    return c


def placement_problem(exp: Experiment, topology: Topology, paths: PathModel,
                      c: Costs | None) -> PlacementProblem:
    """The link costs and compute times the link-aware placements choose from; ``evaluate``
    is the simulator's iteration time with the cell's schedule."""
    w = exp.workload
    c = _known(c, f"placement {exp.placement_name}")

    def cost(a: str, b: str) -> LinkCost:
        p = paths.between_dcs(a, b)
        return LinkCost(p.delay_s, p.rate_bps)

    def evaluate(slots: list[Slot]) -> float:
        schedule = schedule_for(exp, paths, c, slots, _CANDIDATE_SCHEDULE.get(w.schedule))
        return simulate(_sim_input(exp, paths, c, slots, schedule)).span_s

    return PlacementProblem(
        topology, w.parallel.pp, w.parallel.dp, w.microbatches, c.first.f, c.first.b,
        c.message_bytes, cost,
        lambda n, lc: Path((), lc.rate_bps, lc.delay_s).serialization_s(n), evaluate,
        w.ranks_per_host)


def plan_cell(cell: Cell) -> CellPlan:
    """Plan one cell: network model, costs, placement, schedule, prediction. Raises PlanError
    (or SpecError from the placement) when the cell cannot be planned."""
    exp = cell.experiment
    w = exp.workload
    topology = exp.network_topology()
    links = topology.resolved_links(exp.links.inter_dc, exp.links.per_link)
    paths = PathModel(topology, links, w.connections)
    try:
        times = stage_times(w)
        c = Costs(times, message_bytes(w)) if times is not None else None
        slots = place(exp.placement, topology, w.parallel.pp, w.parallel.dp,
                      lambda: placement_problem(exp, topology, paths, c), w.ranks_per_host)
        schedule = schedule_for(exp, paths, c, slots)
    except ValueError as e:  # compute times unknown, a schedule that cannot be built
        raise PlanError(f"cannot plan cell {cell.cell_id}: {e}") from None
    plan = CellPlan(cell, topology, links, paths, c, slots, schedule)
    plan.start_offsets = start_offsets(w.wan_sharing, paths, slots, w.parallel.pp,
                                       w.parallel.dp, message_bytes(w))
    _predict(plan)
    return plan


def predict(plan: CellPlan, memory_limit: int | None = None) -> dict[str, Any]:
    """The simulator's ``predicted_*`` values for ``plan`` (``memory_limit`` checked, see
    ``testbed.sim.predicted``); raises SimulationError when it cannot be simulated."""
    w = plan.experiment.workload
    if w.gradient_sync.outer:
        out, plan.iteration_predictions = outer_prediction(
            plan.sim_input(), plan.slots, plan.schedule, w,
            grad_numel(w, plan.schedule.n_stages), memory_limit)
        return out
    return predicted(run(plan.sim_input()), memory_limit)


def _predict(plan: CellPlan) -> None:
    if not plan.experiment.workload.schedule_known:
        plan.prediction_note = ("the program's schedule is unknown: set workload.schedule or "
                                "schedule_file to predict it")
        return
    try:
        plan.prediction = predict(plan)
    except SimulationError as e:
        plan.prediction_note = str(e)
        log.info("cell %s: no prediction: %s", plan.cell.cell_id, e)
