"""The low-communication modes in a row (``gradient_sync.mode`` diloco or streaming): the
mode's settings (``gradient_sync_mode``, ``inner_steps``, ``outer_dtype``, ``fragments``,
``overlap_steps``) and

- ``mean_iteration_time_s``: the mean span over the measured iterations, sync steps included
  (the median ``iteration_time_s`` is an inner step's when syncs are rare);
- ``compute_utilization``: compute time over wall time (INTELLECT-1's measure): per rank, its
  compute records' time summed over the measured iterations over the sum of their spans, mean
  over ranks. Pipeline bubbles lower it as much as sync stalls do;
- ``outer_syncs``: measured iterations that ran an outer all-reduce (from the traces);
- ``outer_sync_stall_s``: a sync step's ALLREDUCE_WAIT (the time the rank stood still for
  it), ``outer_sync_s``: the all-reduce from its start to its end; each the mean over ranks,
  then over the measured sync steps;
- ``outer_sync_payload_bytes``: one replica's pseudo-gradient per sync in ``outer_dtype``
  (every stage, one fragment), × bytes_scale;
- ``wan_bytes_per_step_measured`` / ``_planned``: the inter-DC link directions' bytes per
  iteration, summed (``testbed.readout.dataparallel.wire_columns``), and
  ``wan_headers_per_step_measured``: the headers of the frames they counted.

Each has a ``predicted_`` twin from the simulator where one is defined (``testbed.plan.outer``).
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any, Callable

from testbed.plan import CellPlan
from testbed.plan.outer import compute_utilization, grad_numel
from testbed.readout.traces import per_iteration
from testbed.sim.collective import exposed_hidden
from testbed.spec.gradsync import OUTER_DTYPE_BYTES

PREDICTED = ("predicted_mean_iteration_time_s", "predicted_compute_utilization",
             "predicted_outer_sync_stall_s", "predicted_outer_sync_s")


def outer_columns(plan: CellPlan, traces: dict[int, list[dict]],
                  wire: dict[str, Any]) -> dict[str, Any]:
    """The columns above for one cell, from its traces and its links' byte columns."""
    w = plan.experiment.workload
    sync = w.gradient_sync
    out: dict[str, Any] = {"gradient_sync_mode": sync.mode, "inner_steps": sync.inner_steps,
                           "outer_dtype": sync.outer_dtype, "fragments": sync.outer_fragments,
                           "overlap_steps": sync.overlap_steps}
    out.update({k: plan.prediction.get(k) for k in PREDICTED})
    payload = sum(grad_numel(w, plan.schedule.n_stages)) * OUTER_DTYPE_BYTES[sync.outer_dtype]
    out["outer_sync_payload_bytes"] = round(payload / sync.outer_fragments)
    out.update(wan_per_step(wire))
    iters = per_iteration(traces)
    if not iters:
        return out
    spans = [i["span_s"] for i in iters]
    ranks = sorted(iters[0]["busy_s"])
    out["mean_iteration_time_s"] = round(statistics.fmean(spans), 6)
    out["compute_utilization"] = round(compute_utilization(
        [[i["busy_s"][r] for r in ranks] for i in iters], spans), 6)
    splits = sync_splits(traces, {i["iter"] for i in iters})
    out["outer_syncs"] = len(splits)
    if splits:
        out["outer_sync_stall_s"] = round(statistics.fmean(e for e, _ in splits.values()), 6)
        out["outer_sync_s"] = round(statistics.fmean(t for _, t in splits.values()), 6)
    return out


def wan_per_step(wire: dict[str, Any]) -> dict[str, Any]:
    """``wan_bytes_per_step_measured`` and ``_planned``, and ``wan_headers_per_step_measured``:
    the link directions' bytes (and frame headers) per iteration
    (``testbed.readout.dataparallel.wire_columns``) summed; None where none."""
    out = {}
    for what, kind in (("bytes", "measured"), ("bytes", "planned"), ("headers", "measured")):
        values = [v for k, v in wire.items() if k.endswith(f"_{what}_per_iter_{kind}")]
        out[f"wan_{what}_per_step_{kind}"] = sum(values) if values else None
    return out


def allreduce_splits(traces: dict[int, list[dict]], keep: Callable[[int], bool]
                     ) -> dict[int, list[tuple[float, float]]]:
    """Per iteration ``keep`` accepts: every rank's (exposed, hidden) all-reduce time from its
    ALLREDUCE records (``testbed.sim.collective.exposed_hidden``; ranks without one left out)."""
    per_iter: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for recs in traces.values():
        by_iter: dict[int, list] = defaultdict(list)
        for r in recs:
            if r.get("type") == "action" and r["kind"].startswith("ALLREDUCE") \
                    and keep(r["iter"]):
                by_iter[r["iter"]].append((r["kind"], r["t0"] / 1e9, r["t1"] / 1e9))
        for it, spans in by_iter.items():
            split = exposed_hidden(spans)
            if split is not None:
                per_iter[it].append(split)
    return per_iter


def sync_splits(traces: dict[int, list[dict]], measured: set[int]
                ) -> dict[int, tuple[float, float]]:
    """Per measured sync step: (stall, total) of its outer all-reduce, mean over ranks."""
    return {it: (statistics.fmean(e for e, _ in v), statistics.fmean(e + h for e, h in v))
            for it, v in allreduce_splits(traces, measured.__contains__).items()}
