"""The row of a cell with a controller in the loop (``controller:``), from the controller's
log (``testbed.runner.controller``) and the traces.

Each measured iteration ran under the allocation decided after the one before it. If that
decision's rates were in force only after the iteration started (its ``applied`` time later
than the earliest rank's start), the iteration is flagged late. Each iteration is predicted
by the simulator with the driven links at the allocation's rates, and the row's ``predicted_*``
columns are made from those predictions the way the measured figures are made from the
iterations (``testbed.plan.phases.combined``). ``controller.csv`` in the cell directory has
one row per iteration: slots and rate per direction, the rates the shaper had in force after
the change, whether it was late, measured and predicted iteration time.

Columns: ``controller_policy``; ``controller_changes`` (decisions that changed a rate);
``controller_late`` (measured iterations whose allocation landed after they started);
``controller_readback_ok`` (every rate the shaper had in force equalled the one set).
"""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from testbed.plan.phases import combined, prediction_with_rates
from testbed.readout.traces import load_traces

def controller_readout(plan, root: Path, log: list[dict],
                       pairs: dict[str, tuple[str, str]]) -> tuple[dict[str, Any], bytes]:
    """(the controller's columns, the text of controller.csv) from its ``log`` and the
    traces in ``root``; ``pairs``: each driven link's two direction names."""
    w = plan.experiment.workload
    starts, spans, measured = _iterations(load_traces(root))
    by_iter = {d["for_iteration"]: d for d in log}
    cache: dict[tuple, dict] = {}
    rows, predictions = [], []
    current = by_iter[0]
    for it in range(w.iterations):
        current = by_iter.get(it, current)
        late = it in starts and current["for_iteration"] == it and current["applied_ns"] > starts[it]
        key = tuple(sorted(current["rate_mbit"].items()))
        if key not in cache:
            cache[key] = prediction_with_rates(plan, _link_rates(pairs, current["rate_mbit"]))
        pred = cache[key]
        if it in measured:
            predictions.append(pred)
        rows.append({"iteration": it, "measured": int(it in measured), "late": int(late),
                     "iteration_time_s": spans.get(it),
                     "predicted_iteration_time_s": pred.get("predicted_iteration_time_s"),
                     **{f"slots {d}": n for d, n in current["slots"].items()},
                     **{f"rate_mbit {d}": r for d, r in current["rate_mbit"].items()},
                     **{f"in_force_mbit {d}": r for d, r in current["in_force_mbit"].items()}})
    out = {"controller_policy": plan.experiment.controller.policy,
           "controller_changes": sum(bool(d["changed"]) for d in log if d["after_iteration"] >= 0),
           "controller_late": sum(r["late"] for r in rows if r["measured"]),
           "controller_readback_ok": all(d["in_force_mbit"][k] in (None, v)
                                         for d in log for k, v in d["rate_mbit"].items())}
    out.update({k: (round(v, 6) if isinstance(v, float) else v)
                for k, v in combined(predictions).items()})
    return out, _csv(rows)


def _link_rates(pairs: dict[str, tuple[str, str]], rate_mbit: dict[str, float]
                ) -> dict[str, tuple[float, float]]:
    return {name: (rate_mbit[ab], rate_mbit[ba]) for name, (ab, ba) in pairs.items()}


def _iterations(traces: dict[int, list[dict]]) -> tuple[dict[int, int], dict[int, float], set]:
    """(iteration → earliest start ns, iteration → span s, the measured iterations)."""
    starts, ends, measured = {}, {}, set()
    for recs in traces.values():
        for r in recs:
            if r.get("type") == "iter":
                it = r["iter"]
                starts[it] = min(starts.get(it, r["t0"]), r["t0"])
                ends[it] = max(ends.get(it, r["t1"]), r["t1"])
                if not r["warmup"]:
                    measured.add(it)
    return starts, {it: round((ends[it] - starts[it]) / 1e9, 6) for it in starts}, measured


def _csv(rows: list[dict]) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue().encode()
