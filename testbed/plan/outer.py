"""Predictions of the low-communication modes (``gradient_sync.mode`` diloco or streaming,
``testbed.spec.gradsync``): an inner step has no data-parallel traffic; a sync step adds the
outer all-reduce of the pseudo-gradient, as ring steps on the same link FIFOs as the
pipeline's messages (``testbed.sim.collective``), started after the rank's last action
(blocking) or with the iteration (overlapped with it). Each kind of iteration is simulated
once; the row's prediction is made from the prediction of every measured iteration, with the
statistics the measured figures use.
"""
from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from typing import Any

from testbed.schedule.ir import Schedule
from testbed.sim import predicted, run
from testbed.sim.collective import predicted_allreduce, rank_splits
from testbed.sim.iteration import SimInput, SimResult
from testbed.sim.inputs import collective_steps
from testbed.spec.costs import FLOAT32_BYTES, gradient_bytes
from testbed.spec.gradsync import AT_START
from testbed.spec.workload import Workload
from testbed.topology import Slot

Kind = tuple[tuple[int, str], ...]  # the (fragment, where) syncs of one iteration


def sync_input(inner: SimInput, slots: list[Slot], schedule: Schedule, w: Workload,
               grad_numel: list[int], kind: Kind) -> SimInput:
    """The input of an iteration running the outer all-reduces ``kind`` (none: ``inner``)."""
    if not kind:
        return inner
    sync = w.gradient_sync
    wire = [sum(sync.wire_numel(n, f) for f, _ in kind) for n in grad_numel]
    steps = collective_steps(slots, schedule, wire, sync.algorithm, sync.bucket_numel)
    return dataclasses.replace(inner, collectives=steps, overlap=False,
                               at_start=any(where == AT_START for _, where in kind))


def measured_kinds(w: Workload) -> dict[int, Kind]:
    """The syncs of every measured iteration."""
    return {it: tuple(w.gradient_sync.syncs_in(it)) for it in range(w.warmup, w.iterations)}


def run_kinds(w: Workload) -> Counter:
    """How many of the iterations run (warm-up included) hold each kind of sync."""
    return Counter(tuple(w.gradient_sync.syncs_in(it)) for it in range(w.iterations))


def grad_numel(w: Workload, n_stages: int) -> list[int]:
    """Gradient (and pseudo-gradient) elements of each virtual stage, × bytes_scale."""
    return [gradient_bytes(w, [s]) // FLOAT32_BYTES for s in range(n_stages)]


def outer_prediction(inner: SimInput, slots: list[Slot], schedule: Schedule, w: Workload,
                     grad_numel: list[int], memory_limit: int | None = None
                     ) -> tuple[dict[str, Any], dict[int, float]]:
    """(the row's ``predicted_*`` values, each measured iteration's predicted time)."""
    kinds = measured_kinds(w)
    results: dict[Kind, SimResult] = {
        k: run(sync_input(inner, slots, schedule, w, grad_numel, k)) for k in set(kinds.values())}
    per_it = {it: results[k] for it, k in kinds.items()}
    syncs = [res for it, res in per_it.items() if kinds[it]]
    common = statistics.mode(kinds.values())  # most iterations: the inner step
    out = predicted(results[common], memory_limit)
    for key in ("predicted_allreduce_exposed_s", "predicted_allreduce_hidden_s"):
        values = [v for v in (predicted_allreduce(res).get(key) for res in syncs) if v is not None]
        out[key] = round(statistics.median(values), 6) if values else None
    spans = [res.span_s for res in per_it.values()]
    out["predicted_iteration_time_s"] = round(statistics.median(spans), 6)
    out["predicted_mean_iteration_time_s"] = round(statistics.fmean(spans), 6)
    out["predicted_bubble_ratio"] = round(statistics.fmean(
        statistics.fmean(res.bubble_ratios) for res in per_it.values()), 6)
    out["predicted_exposed_comm_s"] = round(statistics.median(
        res.metrics()["exposed_comm_s"] for res in per_it.values()), 6)
    out["predicted_compute_utilization"] = round(compute_utilization(
        [res.busy_s for res in per_it.values()], spans), 6)
    stall, total = zip(*(outer_sync_times(res) for res in syncs)) if syncs else ((), ())
    out["predicted_outer_sync_stall_s"] = round(statistics.fmean(stall), 6) if stall else None
    out["predicted_outer_sync_s"] = round(statistics.fmean(total), 6) if total else None
    return out, {it: round(res.span_s, 6) for it, res in per_it.items()}


def compute_utilization(busy: list[list[float]], spans: list[float]) -> float:
    """Compute time over wall time (INTELLECT-1's measure), per rank summed over the
    iterations, mean over ranks: ``busy[i][r]`` is rank r's compute in iteration i."""
    ranks = len(busy[0])
    return statistics.fmean(sum(b[r] for b in busy) / sum(spans) for r in range(ranks))


def outer_sync_times(res: SimResult) -> tuple[float, float]:
    """(stall, total) of a simulated sync step, mean over the ranks that all-reduce: the
    ALLREDUCE_WAIT, and the all-reduce's time from its start to its end (the stall included),
    as ``testbed.sim.collective.exposed_hidden`` splits them."""
    splits = rank_splits(res)
    if not splits:
        return 0.0, 0.0
    return statistics.fmean(e for e, _ in splits), statistics.fmean(e + h for e, h in splits)
