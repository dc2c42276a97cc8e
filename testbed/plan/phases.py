"""The simulator's prediction over a cell's phases: a cell whose links have time-varying steps
runs through several link states; each state (a phase) is simulated on its own, with the
cell's planned schedule and placement (the workers keep them through the run), and the row's
prediction is made from the per-iteration predictions the same way the measured figures are
made from the iterations (median time, mean bubble), so that measured and predicted cover the
same phases in the same proportions.
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from testbed.errors import MachineError
from testbed.net.backends import backend_class
from testbed.plan.cellplan import CellPlan, predict
from testbed.sim import SimulationError
from testbed.sim.paths import PathModel
from testbed.spec import Experiment
from testbed.topology import ResolvedLink

# a phase's link state: per inter-DC link (in plan order) how many of its steps are in force
State = tuple[int, ...]


def at_iteration_problem(exp: Experiment) -> str:
    """Why the experiment's at_iteration steps cannot be timed ('' when they can): they are
    applied when rank 0's trace shows the iteration before done, which needs the trace on this
    machine while the run goes on (``Backend.traces_live``; not so on lab hosts)."""
    links = exp.topology.links or []
    if not any(st.at_iteration is not None for link in links for st in link.steps):
        return ""
    try:
        live = backend_class(exp.backend).traces_live
    except MachineError:  # its packages are missing: the run says so, planning need not
        return ""
    if not live:
        return ("at_iteration steps need rank 0's trace on this machine during the run; "
                f"backend {exp.backend} brings traces back at the end: give the steps at_s")
    return ""


def has_steps(plan: CellPlan) -> bool:
    return any(link.steps for link in plan.links)


def links_in_state(plan: CellPlan, state: State) -> list[ResolvedLink]:
    """The plan's inter-DC links with the first ``state[k]`` steps of link k in force."""
    out = []
    for link, n in zip(plan.links, state):
        if n:
            _, fwd, rev = link.step_profiles()[n - 1]
            link = link.model_copy(update={"a_to_b": fwd, "b_to_a": rev})
        out.append(link)
    return out


def phase_prediction(plan: CellPlan, state: State) -> dict[str, Any]:
    """The ``predicted_*`` columns of the cell with its links in ``state``; empty when the cell
    cannot be simulated (no modelled compute times)."""
    if not any(state):
        return dict(plan.prediction)
    links = links_in_state(plan, state)
    paths = PathModel(plan.topology, links, plan.experiment.workload.connections)
    try:
        return predict(dataclasses.replace(plan, links=links, paths=paths))
    except SimulationError:
        return {}


def prediction_with_rates(plan: CellPlan, rates: dict[str, tuple[float, float]]
                          ) -> dict[str, Any]:
    """The ``predicted_*`` columns of the cell with the named links at these (a→b, b→a) rates
    (Mbit/s; a controller's allocation), the others as planned; empty when the cell cannot be
    simulated."""
    links = [lk if lk.name not in rates else lk.model_copy(update={
        "a_to_b": lk.a_to_b.model_copy(update={"rate_mbit": rates[lk.name][0]}),
        "b_to_a": lk.b_to_a.model_copy(update={"rate_mbit": rates[lk.name][1]})})
        for lk in plan.links]
    paths = PathModel(plan.topology, links, plan.experiment.workload.connections)
    try:
        return predict(dataclasses.replace(plan, links=links, paths=paths))
    except SimulationError:
        return {}


class PhasePredictor:
    """Predictions per link state, each simulated once."""

    def __init__(self, plan: CellPlan):
        self.plan = plan
        self._cache: dict[State, dict[str, Any]] = {}

    def __call__(self, state: State) -> dict[str, Any]:
        if state not in self._cache:
            self._cache[state] = phase_prediction(self.plan, state)
        return self._cache[state]


def combined(per_iteration: list[dict[str, Any]]) -> dict[str, Any]:
    """The row's prediction from each measured iteration's phase prediction: median iteration
    time and exposed communication, mean bubble, highest peak in flight (the measured figures'
    statistics). Empty when any phase has no prediction."""
    if not per_iteration or any(not p for p in per_iteration):
        return {}
    out = {}
    for key, how in (("predicted_iteration_time_s", statistics.median),
                     ("predicted_exposed_comm_s", statistics.median),
                     ("predicted_bubble_ratio", statistics.fmean),
                     ("predicted_peak_inflight", max)):
        values = [p[key] for p in per_iteration if p.get(key) is not None]
        if values:
            out[key] = how(values)
    return out
