"""A traced program's all-reduces (``collective`` records, ``testbed.train.instrument``) in its
row: the same columns as the built-in worker's low-communication modes
(``testbed.readout.outer``), measured from outside.

Each ``all_reduce`` call (blocking or ``async_op=True``) and each wait of an async one's work
is placed in the measured iteration of its rank in which it started. A *sync step* is a
measured iteration in which any rank called one:

- ``outer_syncs``: the measured sync steps; ``iterations.csv``'s ``outer_sync`` marks them
  with the number of calls;
- ``outer_sync_stall_s``: per sync step, each rank's time inside its blocking calls and its
  waits (the time it stood still for them), mean over ranks, then over the sync steps;
- ``outer_sync_payload_bytes``: per sync step, the bytes of each rank's all-reduced tensors,
  mean over ranks, then over the sync steps;
- ``mean_iteration_time_s``: the mean period over the measured iterations, sync steps included;
- ``compute_utilization``: the instrument sees no compute outside pipelining, so for a
  program it is the time not spent blocked in all-reduces: per rank, 1 − its stall over its
  measured iterations' time, mean over ranks (INTELLECT-1 measured it so).

An ``async_op=True`` call returns at once: its stall is its wait's.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any


def program_sync_columns(traces: dict[int, list[dict]]) -> tuple[dict[str, Any], dict[int, int]]:
    """(the columns above, {measured iteration: all-reduce calls in it}); empty without
    ``collective`` records."""
    stall: dict[int, dict[int, float]] = defaultdict(dict)   # iteration → rank → s
    sent: dict[int, dict[int, int]] = defaultdict(dict)      # iteration → rank → bytes
    calls: dict[int, int] = defaultdict(int)
    time_by_rank: dict[int, float] = defaultdict(float)
    periods: list[float] = []
    for rank, recs in traces.items():
        iters = sorted((r["t0"], r["t1"], r["iter"]) for r in recs
                       if r.get("type") == "iter" and not r["warmup"])
        for t0, t1, _ in iters:
            time_by_rank[rank] += (t1 - t0) / 1e9
            periods.append((t1 - t0) / 1e9)
        for c in (r for r in recs if r.get("type") == "collective"):
            it = next((i for t0, t1, i in iters if t0 <= c["t0"] < t1), None)
            if it is None:
                continue
            if c.get("blocking"):  # a blocking call or an async one's wait
                stall[it][rank] = stall[it].get(rank, 0.0) + (c["t1"] - c["t0"]) / 1e9
            if c.get("op", "all_reduce") == "all_reduce":
                sent[it][rank] = sent[it].get(rank, 0) + c["bytes"]
                calls[it] += 1
    if not calls:
        return {}, {}
    ranks = list(traces)
    per_step = [statistics.fmean(stall[it].get(r, 0.0) for r in ranks) for it in calls]
    stalled = {r: sum(stall[it].get(r, 0.0) for it in calls) for r in ranks}
    out = {"outer_syncs": len(calls),
           "outer_sync_stall_s": round(statistics.fmean(per_step), 6),
           "outer_sync_payload_bytes": round(statistics.fmean(
               statistics.fmean(sent[it].get(r, 0) for r in ranks) for it in calls)),
           "mean_iteration_time_s": round(statistics.fmean(periods), 6) if periods else None,
           "compute_utilization": round(statistics.fmean(
               1 - stalled[r] / time_by_rank[r] for r in ranks if time_by_rank[r] > 0), 6)}
    return out, dict(calls)
