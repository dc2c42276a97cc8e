"""A cell's per-iteration series, ``cells/<id>/iterations.csv``: one row per measured
iteration with its start (s since the workers were started, on the traces' clock), span,
bubble and exposed communication, the phase it ran in and that phase's prediction, whether a
step's update was under way during it (``step_during``: asked for before its end, returned
after its start: the iteration ran partly in each state), and for every inter-DC link the
delay (ms, one way, a→b), rate (Mbit/s, empty: unshaped) and loss (%) in force at its start
(from the link's profile and the times its steps' updates returned).

For a cell with time-varying steps the row's ``predicted_*`` columns are replaced by the
prediction over the same phases (``testbed.plan.phases``).

Where the all-reduce runs (dp > 1): ``allreduce_exposed_s``, the time the ranks stood still
for it in that iteration (their ALLREDUCE_WAIT, mean over ranks; a sync step's stall in the
low-communication modes, which also get ``compute_utilization``: compute time over the
iteration's span, mean over ranks). Where the routers' counters are sampled
(``testbed.net.wiresampler``: the local backends): ``link_<name>_from_<dc>_bytes_measured``
for every inter-DC link direction, the bytes (frames, headers included) its sending
interface counted from the iteration's start to the next one's (the last: to its end), and
``wan_bytes_measured``, their sum.

Nothing here writes: the series comes back as rows (``series_csv`` is its file's text), and the
runner keeps it in the cell directory (``CellDir.iterations``).
"""
from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path
from typing import Any

from testbed.readout.outer import allreduce_splits
from testbed.readout.traces import by_period, iteration_stats, load_traces, per_iteration, summarize
from testbed.net.steps import StepPlayer
from testbed.net.wiresampler import WireSampler
from testbed.plan import CellPlan
from testbed.plan.phases import PhasePredictor, State, combined, has_steps, links_in_state
from testbed.readout import columns

Series = list[dict[str, Any]]  # one dict per measured iteration: iterations.csv's rows
FIXED = ["iteration", "phase", "start_s", "iteration_time_s", "bubble_ratio", "exposed_comm_s",
         "predicted_iteration_time_s", "step_during"]


SPAN, PERIOD = "span", "period"  # the row's iteration_basis (testbed.readout.traces)


def metrics_and_series(cell_dir: Path, plan: CellPlan, player: StepPlayer, basis: str = SPAN,
                       traces: dict[int, list[dict]] | None = None,
                       wire: WireSampler | None = None) -> tuple[dict[str, Any], Series]:
    """(the cell's metrics, its per-iteration series) from its traces, iteration time on
    ``basis``, with the bytes ``wire`` sampled on the links. Raises WorkerError on bad
    traces."""
    traces = traces if traces is not None else load_traces(cell_dir)
    iters = per_iteration(traces)
    if basis == PERIOD:
        iters = by_period(iters)
    out = {**summarize(iters, plan.experiment.workload), "iteration_basis": basis}
    predictor = PhasePredictor(plan)
    rows = iteration_rows(iters, plan, player, predictor)
    _add_sync_columns(rows, iters, plan, traces)
    if wire is not None:
        _add_wire_columns(rows, iters, plan, wire)
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


def _add_sync_columns(rows: Series, iters: list[dict], plan: CellPlan,
                      traces: dict[int, list[dict]]) -> None:
    """Each row's ``allreduce_exposed_s`` (dp > 1) and, in a low-communication mode, its
    ``compute_utilization``."""
    w = plan.experiment.workload
    if w.parallel.dp < 2:
        return
    splits = allreduce_splits(traces, lambda it: True)
    if not splits:  # a program's own all-reduces are not the worker's (readout.collectives)
        return
    for row, i in zip(rows, iters):
        got = splits.get(i["iter"])
        row["allreduce_exposed_s"] = round(statistics.fmean(e for e, _ in got), 6) \
            if got else 0.0
        if w.gradient_sync.outer and i["span_s"] > 0:
            row["compute_utilization"] = round(statistics.fmean(
                b / i["span_s"] for b in i["busy_s"].values()), 6)


def _add_wire_columns(rows: Series, iters: list[dict], plan: CellPlan,
                      wire: WireSampler) -> None:
    """Each row's bytes per inter-DC link direction, from ``wire``'s samples (nothing
    without samples)."""
    if not wire.sampled():
        return
    name = {f"{src}->{dst}": f"{columns.LINK_PREFIX}{link.name}_from_{src}_bytes_measured"
            for link in plan.links for src, dst in ((link.a, link.b), (link.b, link.a))}
    for k, (row, i) in enumerate(zip(rows, iters)):
        nxt = iters[k + 1] if k + 1 < len(iters) else None
        end = nxt["t0_ns"] if nxt is not None and nxt["iter"] == i["iter"] + 1 \
            else i["t0_ns"] + round(i["span_s"] * 1e9)
        sent = wire.between(i["t0_ns"], end)
        for key, n in sorted(sent.items()):
            if key in name:
                row[name[key]] = n
        row["wan_bytes_measured"] = sum(sent.values())


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
