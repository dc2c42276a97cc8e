"""Summary tables and plots rebuilt from a run directory's results.csv (and cell traces for the
timeline). ``python -m testbed report RUN_DIR`` calls :func:`build_report`.
"""
from __future__ import annotations

import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from testbed.errors import writing  # noqa: E402
from testbed.readout import columns  # noqa: E402
from testbed.report import sections, tables  # noqa: E402
from testbed.report.phaseplot import phase_plots  # noqa: E402
from testbed.runner.store import atomic_write, cell_path, save_figure  # noqa: E402
from testbed.traceformat import read_trace  # noqa: E402

log = logging.getLogger(__name__)
COLORS = {"F": "#4c72b0", "B": "#dd8452", "I": "#c44e52", "W": "#55a868"}


def swept_columns(df: pd.DataFrame) -> list[str]:
    """The swept parameters: the columns between the head and the fixed body columns."""
    return columns.swept(list(df.columns))


def build_report(run_dir: Path) -> list[Path]:
    """Write summary.md and plots/*.png for ``run_dir``; returns the files written.

    Raises FileNotFoundError when results.csv is missing, StorageError when a file cannot be
    written.
    """
    run_dir = Path(run_dir)
    df = pd.read_csv(run_dir / "results.csv")
    plots = run_dir / "plots"
    with writing(plots, "create"):
        plots.mkdir(exist_ok=True)
    written = [_summary(df, run_dir)]
    ok = df[df["status"] == "ok"]
    if len(ok):
        written += _metric_plots(ok, plots)
        written += _timeline_plot(ok, run_dir, plots)
        written += phase_plots(ok, run_dir, plots)
    return written


def results_table(df: pd.DataFrame, run_dir: Path) -> pd.DataFrame:
    """One line per cell: axis values, status, iterations pooled, the medians with their
    95 % interval bounds (``<metric>_lo`` / ``_hi``) and the prediction."""
    return tables.cell_table(df, run_dir)


def axis_tables(df: pd.DataFrame, run_dir: Path) -> list[tuple[str, pd.DataFrame]]:
    """(axis, one line per value over the ok rows) for every axis with more than one value."""
    ok = df[df["status"] == "ok"]
    return [(axis, tables.axis_table(df, run_dir, axis)) for axis in tables.axes(df)
            if len(ok) and ok[axis].astype(str).nunique() > 1]


def _summary(df: pd.DataFrame, run_dir: Path) -> Path:
    lines = [f"# {df['experiment'].iloc[0]} — run {df['run_id'].iloc[0]}", ""]
    n_ok = int((df["status"] == "ok").sum())
    cells = tables.cell_table(df, run_dir)
    names = tables.axes(df)
    per_iteration = any(Path(run_dir, "cells").glob("*/iterations.csv"))
    lines += [f"{len(df)} rows: {n_ok} ok, {len(df) - n_ok} failed or skipped.", "",
              "Medians over every measured iteration of every repeat (`n` iterations); "
              if per_iteration else "This run has no per-iteration series (`iterations.csv`"
              ", recorded before it existed): `n` counts rows, each the row's median; ",
              "[low, high] is the 95 % order-statistic interval of the median (none below 6 "
              "values). tokens/s counts the gaps between iterations "
              "(`iteration_throughput_tokens_s` leaves them out; older runs: one batch per "
              "median iteration).", "",
              "## All cells", "", tables.markdown(tables.with_ci_text(cells)), ""]
    for axis, by in axis_tables(df, run_dir):
        lines += [f"## By {axis} (pooled over the other axes)", "",
                  tables.markdown(tables.with_ci_text(by)), ""]
    lines += sections.delay_bubble_section(cells, names)
    lines += sections.phase_section(df, run_dir)
    lines += sections.degraded_section(df)
    failed = df[df["status"] != "ok"]
    if len(failed):
        lines += ["## Failed cells", ""]
        lines += [f"- `{r.cell_id}` repeat {r.repeat}: {r.error}" for r in failed.itertuples()]
    path = run_dir / "summary.md"
    atomic_write(path, ("\n".join(lines) + "\n").encode())
    return path


def _axis(df: pd.DataFrame, suffix: str) -> str | None:
    return next((c for c in swept_columns(df) if c.endswith(suffix) and df[c].nunique() > 1), None)


def _metric_plots(ok: pd.DataFrame, plots: Path) -> list[Path]:
    """Metric-vs-axis plots; a metric no row has (a program's row without compute records
    has no bubble) gets no plot."""
    out: list[Path | None] = []
    group = "schedule" if ok["schedule"].nunique() > 1 else None
    delay = _axis(ok, "delay_ms")
    if delay:
        out.append(_line_plot(ok, delay, "bubble_ratio", group, plots / "bubble_vs_delay.png",
                              "Bubble ratio (idle / span) vs one-way inter-DC delay",
                              "one-way inter-DC delay (ms)", "bubble ratio"))
        out.append(_line_plot(ok, delay, "iteration_time_s", group, plots / "iteration_vs_delay.png",
                              "Iteration time vs one-way inter-DC delay",
                              "one-way inter-DC delay (ms)", "iteration time (s)"))
    rate = _axis(ok, "rate_mbit")
    if rate:
        for metric, label in [("iteration_time_s", "iteration time (s)"),
                              ("throughput_tokens_s", "throughput (tokens/s)")]:
            out.append(_line_plot(ok, rate, metric, group, plots / f"{metric}_vs_rate.png",
                                  f"{label.split(' (')[0].capitalize()} vs inter-DC rate",
                                  "inter-DC rate (Mbit/s)", label))
    return [p for p in out if p is not None]


def _line_plot(df, x, y, group, path, title, xlabel, ylabel) -> Path | None:
    if y not in df or df[y].isna().all():
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for name, part in (df.groupby(group) if group else [("all", df)]):
        means = part.groupby(x)[y].mean().sort_index()
        ax.plot(means.index, means.values, marker="o", label=str(name))
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    if group:
        ax.legend(title=group)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


def _timeline_plot(ok: pd.DataFrame, run_dir: Path, plots: Path) -> list[Path]:
    """A Gantt chart of F/B/I/W per rank for the last measured iteration of one cell."""
    row = ok.iloc[-1]
    cell_id, repeat = row["cell_id"], int(row["repeat"])
    cell_dir = cell_path(run_dir, cell_id, repeat)
    traces = sorted(cell_dir.glob("trace-rank*.jsonl"))
    if not traces:
        log.info("no traces in %s; timeline skipped", cell_dir)
        return []
    fig, ax = plt.subplots(figsize=(9, 1 + 0.6 * len(traces)))
    t_min = None
    bars = []
    for path in traces:
        recs = list(read_trace(path))
        rank = next((r["rank"] for r in recs if r.get("type") == "meta"), None)
        iters = [r for r in recs if r.get("type") == "iter" and not r.get("warmup")]
        if rank is None or not iters:
            continue
        last = iters[-1]
        t_min = last["t0"] if t_min is None else min(t_min, last["t0"])
        bars += [(rank, r) for r in recs if r.get("type") == "action" and r.get("cat") == "compute"
                 and r.get("iter") == last["iter"]]
    for rank, r in bars:
        ax.broken_barh([((r["t0"] - t_min) / 1e6, (r["t1"] - r["t0"]) / 1e6)], (rank - 0.4, 0.8),
                       color=COLORS.get(r["kind"], "#8c8c8c"))
        ax.text((r["t0"] + r["t1"] - 2 * t_min) / 2e6, rank, f"{r['kind']}{r.get('mb', '')}",
                ha="center", va="center", fontsize=6, color="white")
    label = " ".join(f"{c.rsplit('.', 1)[-1]}={row[c]}" for c in swept_columns(ok))
    ax.set(title=f"Timeline of cell {cell_id} ({label}), last measured iteration",
           xlabel="time (ms)", ylabel="rank")
    ax.set_yticks(sorted({b[0] for b in bars}))
    ax.invert_yaxis()
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, list(COLORS), ncol=4, fontsize=7, loc="lower center",
              bbox_to_anchor=(0.5, 1.08), frameon=False)
    fig.tight_layout()
    path = plots / "timeline.png"
    save_figure(fig, path)
    plt.close(fig)
    return [path]
