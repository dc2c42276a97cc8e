"""A cell's per-iteration series, ``cells/<id>/iterations.csv``: one row per measured
iteration with its start (s since the workers were started, on the traces' clock), span,
bubble and exposed communication, the phase it ran in and that phase's prediction, whether a
step's update was under way during it (``step_during``: asked for before its end, returned
after its start: the iteration ran partly in each state), and for every inter-DC link the
delay (ms, one way, a→b), rate (Mbit/s, empty: unshaped) and loss (%) in force at its start
(from the link's profile and the times its steps' updates returned).

For a cell with time-varying steps the row's ``predicted_*`` columns are replaced by the
prediction over the same phases (``testbed.plan.phases``).

Nothing here writes: the series comes back as rows (``series_csv`` is its file's text), and the
runner keeps it in the cell directory (``CellDir.iterations``).
"""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from testbed.readout.traces import by_period, iteration_stats, load_traces, per_iteration, summarize
from testbed.net.steps import StepPlayer
from testbed.plan import CellPlan
from testbed.plan.phases import PhasePredictor, State, combined, has_steps, links_in_state
from testbed.readout import columns

Series = list[dict[str, Any]]  # one dict per measured iteration: iterations.csv's rows
FIXED = ["iteration", "phase", "start_s", "iteration_time_s", "bubble_ratio", "exposed_comm_s",
         "predicted_iteration_time_s", "step_during"]


SPAN, PERIOD = "span", "period"  # the row's iteration_basis (testbed.readout.traces)


def metrics_and_series(cell_dir: Path, plan: CellPlan, player: StepPlayer, basis: str = SPAN,
                       traces: dict[int, list[dict]] | None = None
                       ) -> tuple[dict[str, Any], Series]:
    """(the cell's metrics, its per-iteration series) from its traces, iteration time on
    ``basis``. Raises WorkerError on bad traces."""
    iters = per_iteration(traces if traces is not None else load_traces(cell_dir))
    if basis == PERIOD:
        iters = by_period(iters)
    out = {**summarize(iters, plan.experiment.workload), "iteration_basis": basis}
    predictor = PhasePredictor(plan)
    rows = iteration_rows(iters, plan, player, predictor)
    if has_steps(plan):
        phased = combined([predictor(r["_state"]) for r in rows])
        out.update({k: (round(v, 6) if isinstance(v, float) else v) for k, v in phased.items()})
    return out, rows


def state_at(plan: CellPlan, applied: list[dict], t_s: float) -> State:
    """How many steps of each link were applied at ``t_s`` s after the player started."""
    names = [link.name for link in plan.links]
    counts = [0] * len(names)
    for a in applied:
        if a["applied_s"] <= t_s:
            counts[names.index(a["link"])] += 1
    return tuple(counts)


def iteration_rows(iters: list[dict], plan: CellPlan, player: StepPlayer,
                   predictor: PhasePredictor) -> list[dict[str, Any]]:
    """One dict per measured iteration (with its link state under ``_state``)."""
    rows, phases = [], {}
    for i in iters:
        start = (i["t0_ns"] - player.t0_ns) / 1e9
        state = state_at(plan, player.applied, start)
        phases.setdefault(state, len(phases))
        stats = iteration_stats(i) if any(i["busy_s"].values()) else {}
        row = {"iteration": i["iter"], "phase": phases[state], "start_s": round(start, 4),
               "iteration_time_s": round(i["span_s"], 6),
               "bubble_ratio": _rounded(stats.get("bubble_ratio")),
               "exposed_comm_s": _rounded(stats.get("exposed_comm_s")),
               "predicted_iteration_time_s": plan.iteration_predictions.get(
                   i["iter"], predictor(state).get("predicted_iteration_time_s")),
               "step_during": int(any(a["requested_s"] < start + i["span_s"]
                                      and a["applied_s"] > start for a in player.applied)),
               "_state": state}
        sync = plan.experiment.workload.gradient_sync
        if sync.outer:  # diloco/streaming: the fragments this step synchronised
            row["outer_sync"] = " ".join(str(f) for f, _ in sync.syncs_in(i["iter"]))
        for link in links_in_state(plan, state):
            p = f"{columns.LINK_PREFIX}{link.name}_"
            row.update({p + "delay_ms": link.a_to_b.one_way_delay_ms,
                        p + "rate_mbit": link.a_to_b.rate_mbit,
                        p + "loss_pct": link.a_to_b.loss_pct})
        rows.append(row)
    return rows


def _rounded(v: float | None) -> float | None:
    """``v`` to 6 places; None (an empty cell: an iteration without compute records has no
    bubble) stays None."""
    return None if v is None else round(v, 6)


def series_csv(rows: Series) -> bytes:
    """The text of iterations.csv: ``rows`` as CSV, keys starting with ``_`` left out."""
    fields = [k for k in rows[0] if not k.startswith("_")] if rows else FIXED
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue().encode()
