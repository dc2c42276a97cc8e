"""Summary sections beyond the cell and axis tables: the phases of cells whose links changed
during the run, the bubble that inter-DC delay adds (GeoPipe's convention), and the cells
whose self-fidelity was degraded (``testbed.readout.fidelity``).

Delay-induced bubble: a cell's bubble ratio minus the bubble ratio of the same cell at zero
delay (same values on every other axis), wherever the matrix has that counterpart. Its cut is
relative to the reference schedule (1F1B) at the same delay: 1 − induced / induced(1F1B). The
total-bubble cut beside it is 1 − bubble / bubble(1F1B). GeoPipe reports the first kind (its
78.91 % is a cut of the computation bubble that cross-DC communication causes).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from testbed.readout import columns
from testbed.report.spread import fmt_ci, iterations_of
from testbed.report.tables import markdown

REFERENCE_SCHEDULE = "1f1b"
# axes that belong to the schedule: ignored when looking for the reference schedule's cell
SCHEDULE_KNOBS = ("schedule", "memory_limit", "chunks")
ZERO_DELAYS = {"0", "0.0", "0xTF"}


def phase_section(df: pd.DataFrame, run_dir: Path) -> list[str]:
    """Per cell × repeat whose iterations ran in more than one link state: one line per
    phase (link state, iterations, first start, measured median [CI], prediction)."""
    lines: list[str] = []
    for r in df[df["status"] == "ok"].itertuples(index=False):
        it = iterations_of(run_dir, r.cell_id, int(r.repeat))
        if it is None or it["phase"].nunique() < 2:
            continue
        links = [c for c in it.columns if columns.is_link_column(c)]
        table = pd.DataFrame([{
            "phase": phase, **{c: part[c].iloc[0] for c in links},
            "iterations": len(part), "from s": part["start_s"].min(),
            "iteration_time_s (95% CI)": fmt_ci(list(part["iteration_time_s"])),
            "predicted_iteration_time_s": part["predicted_iteration_time_s"].iloc[0],
            "bubble_ratio (median)": part["bubble_ratio"].median(),
            "with a step under way": int(part.get("step_during", pd.Series([0])).sum())}
            for phase, part in it.groupby("phase")])
        lines += [f"### Cell `{r.cell_id}` repeat {r.repeat}", "", markdown(table), ""]
    if lines:
        lines = ["## Phases (links changed during the run)", "",
                 "Link state at each iteration's start. Each phase is simulated on its own; "
                 "the row's prediction is the median over the measured iterations of their "
                 "phase's prediction (as the measured median is over the iterations).",
                 ""] + lines
    return lines


def _delay_axis(names: list[str]) -> str | None:
    return next((a for a in names if a.endswith("delay_ms")), None)


def delay_bubble_table(cells: pd.DataFrame, names: list[str]) -> pd.DataFrame | None:
    """For each cell (a ``cell_table`` line; ``names`` its axes) with a zero-delay
    counterpart: bubble, the counterpart's, the induced bubble and the cuts vs the reference
    schedule. None when the matrix has no such pairs."""
    delay = _delay_axis(names)
    if delay is None or "bubble_ratio" not in cells:
        return None
    others = [a for a in names if a != delay]

    def key(row) -> tuple:
        return tuple(str(row[a]) for a in others)
    zero = {key(r): r["bubble_ratio"] for _, r in cells.iterrows()
            if str(r[delay]) in ZERO_DELAYS}
    lines = [{"cell_id": r["cell_id"], **{a: r[a] for a in names},
              "bubble_ratio": r["bubble_ratio"], "bubble at 0 delay": zero[key(r)],
              "delay-induced bubble": r["bubble_ratio"] - zero[key(r)]}
             for _, r in cells.iterrows()
             if str(r[delay]) not in ZERO_DELAYS and key(r) in zero]
    if not lines:
        return None
    out = pd.DataFrame(lines)
    sched = next((a for a in names if a.endswith("schedule")), None)
    if sched:
        _add_cuts(out, sched, names)
    return out


def _add_cuts(out: pd.DataFrame, sched: str, names: list[str]) -> None:
    """Columns: induced-bubble cut and total-bubble cut vs the reference schedule's cell."""
    match = [a for a in names if a != sched and not a.endswith(SCHEDULE_KNOBS)]
    ref = {tuple(str(r[a]) for a in match): r for _, r in out.iterrows()
           if str(r[sched]) == REFERENCE_SCHEDULE}
    induced_cut, total_cut = [], []
    for _, r in out.iterrows():
        base = ref.get(tuple(str(r[a]) for a in match))
        ok = base is not None and base["delay-induced bubble"] > 0
        induced_cut.append(1 - r["delay-induced bubble"] / base["delay-induced bubble"]
                           if ok else float("nan"))
        total_cut.append(1 - r["bubble_ratio"] / base["bubble_ratio"]
                         if base is not None else float("nan"))
    out[f"induced-bubble cut vs {REFERENCE_SCHEDULE}"] = induced_cut
    out[f"total-bubble cut vs {REFERENCE_SCHEDULE}"] = total_cut


def delay_bubble_section(cells: pd.DataFrame, names: list[str]) -> list[str]:
    """The delay-induced bubble section of summary.md ([] without zero-delay pairs)."""
    table = delay_bubble_table(cells, names)
    if table is None:
        return []
    return ["## Delay-induced bubble", "",
            "A cell's bubble ratio (median) minus the same cell's at zero delay; the cuts are "
            f"relative to {REFERENCE_SCHEDULE} at the same delay (induced: 1 − induced / "
            f"induced({REFERENCE_SCHEDULE}), GeoPipe's convention; total: 1 − bubble / "
            f"bubble({REFERENCE_SCHEDULE})).", "", markdown(table), ""]


def degraded_section(df: pd.DataFrame) -> list[str]:
    """The "Degraded cells" section of summary.md: each ok row whose ``fidelity`` is
    degraded, with its reasons ([] when none is, or the run predates the column)."""
    if "fidelity" not in df:
        return []
    ok = df[df["status"] == "ok"]
    bad = ok[ok["fidelity"].astype(str).str.startswith("degraded")]
    if not len(bad):
        return []
    return ["## Degraded cells", "",
            "The instrument distorted these measurements beyond what the ±5 % agreement with "
            "the simulator allows (thresholds: docs/architecture.md, \"Fidelity\").", ""] + \
        [f"- `{r.cell_id}` repeat {r.repeat}: {str(r.fidelity).removeprefix('degraded: ')}"
         for r in bad.itertuples()] + [""]
