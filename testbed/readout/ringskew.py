"""Whether the all-reduces that crossed one inter-DC link direction at once ended as far apart
as the simulator has them end.

The simulator serves the transfers on one link direction in the order they are issued
(``testbed.sim.collective``): two stages' rings that cross it at the same time take turns on
it, step by step, and end close together. TCP flows need not share a queue that way. Measured
(``results/leads/dp-ring-sharing/``), the ring that started first kept about 60 % of the link's
bytes while both sent and ended first; the other ring's last steps then crossed the link alone,
each exposing its receive-ready notification and its transit, so that the iteration ended
later than predicted, more so the longer the delay.

``ring_skew`` reads that from a cell: for each link direction the ring steps of two or more
stages cross, the time between the first and the last of those stages to end their steps on
it (median over the measured iterations), measured from the traces and predicted from the
simulator's steps of the same cell; it returns the direction where the measured skew exceeds
the predicted one most. ``check`` names it as the cause of a miss when that excess is half the
gap between the measured and the predicted iteration or more.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable

from testbed.plan import CellPlan
from testbed.sim import SimResult, run
from testbed.sim.iteration import SimInput

# (iteration, rank, stage, rank sent to, end in seconds) of one ring step
Step = tuple[int, int, int, int, float]
Route = Callable[[int, int], list[tuple[str, str]]]
# gives the simulator's input and its iteration of a cell (computed once for several readers)
Simulated = Callable[[], "tuple[SimInput, SimResult]"]


@dataclass(frozen=True)
class RingSkew:
    """On link direction ``src``→``dst``: how far apart the stages' all-reduces ended."""

    src: str
    dst: str
    measured_s: float
    predicted_s: float


def measured_steps(traces: dict[int, list[dict]], warmup: int) -> list[Step]:
    """The ring steps of the measured iterations, from the traces' ALLREDUCE_STEP records."""
    return [(r["iter"], rank, r["stage"], r["peer"], r["t1"] / 1e9)
            for rank, recs in traces.items() for r in recs
            if r.get("kind") == "ALLREDUCE_STEP" and r.get("peer") is not None
            and r["iter"] >= warmup]


def predicted_steps(res: SimResult, collectives) -> list[Step]:
    """The simulator's ring steps of one iteration; a ring timed whole (nothing shaped on its
    paths, so it crosses no shared link direction) has no per-step span and is left out."""
    out = []
    for rank, spans in res.allreduce.items():
        for sp in spans:
            if sp.kind == "ALLREDUCE_STEP" and sp.microbatch is not None:
                step = collectives[rank][sp.stage][sp.microbatch]
                out.append((0, rank, sp.stage, step.send_to, sp.t1))
    return out


def skews(steps: Iterable[Step], route: Route) -> dict[tuple[str, str], float]:
    """Per link direction crossed by the steps of two or more stages: the time from the first
    to the last of those stages' last step on it, median over iterations."""
    ends: dict[tuple[str, str], dict[int, dict[int, float]]] = defaultdict(
        lambda: defaultdict(dict))
    for it, rank, stage, peer, t1 in steps:
        for hop in route(rank, peer):
            by_stage = ends[hop][it]
            by_stage[stage] = max(t1, by_stage.get(stage, t1))
    out = {}
    for hop, per_iter in ends.items():
        spread = [max(e.values()) - min(e.values()) for e in per_iter.values() if len(e) > 1]
        if spread:
            out[hop] = statistics.median(spread)
    return out


def simulated(plan: CellPlan) -> tuple[SimInput, SimResult]:
    """The simulator's input for ``plan`` and one iteration of it."""
    inp = plan.sim_input()
    return inp, run(inp)


def ring_skew(traces: dict[int, list[dict]], plan: CellPlan,
              sim: Simulated | None = None) -> RingSkew | None:
    """The link direction whose all-reduces ended furthest apart beyond the prediction; None
    when no direction carries two stages' ring steps (or the cell has no prediction).
    ``sim`` gives the simulated iteration (default: ``simulated(plan)``)."""
    w = plan.experiment.workload
    if w.parallel.dp == 1 or w.gradient_sync.outer or plan.costs is None:
        return None
    slot = {s.rank: s for s in plan.slots}

    def route(rank: int, peer: int) -> list[tuple[str, str]]:
        return plan.paths.route(slot[rank].dc, slot[peer].dc)

    got = skews(measured_steps(traces, w.warmup), route)
    if not got:
        return None
    inp, res = sim() if sim is not None else simulated(plan)
    want = skews(predicted_steps(res, inp.collectives), route)
    hop = max(got, key=lambda h: got[h] - want.get(h, 0.0))
    return RingSkew(hop[0], hop[1], got[hop], want.get(hop, 0.0))


def check(skew: RingSkew | None, measured_s: float | None, predicted_s: float | None,
          band_pct: float) -> str:
    """A fidelity reason: the direction whose all-reduces ended further apart than predicted,
    when the iteration missed its prediction by more than ``band_pct`` and that excess is half
    the miss or more; "" otherwise."""
    if skew is None or not measured_s or not predicted_s:
        return ""
    miss = measured_s - predicted_s
    if abs(miss) <= band_pct / 100 * predicted_s:
        return ""
    if skew.measured_s - skew.predicted_s < 0.5 * abs(miss):
        return ""
    return (f"the all-reduces crossing link {skew.src}->{skew.dst} ended "
            f"{skew.measured_s:.3f} s apart, predicted {skew.predicted_s:.3f} s (the simulator "
            "has them take turns on it)")
