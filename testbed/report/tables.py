"""The tables of a run's summary and end-of-run table: one line per cell and per axis value,
each with the median and its 95 % interval (``testbed.report.spread``).

An axis is every field that varies across the rows: the swept parameters and the planned
settings (placement, the stages' DCs, …) unless a swept parameter already names them.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from testbed.readout import columns
from testbed.report.spread import median_ci, samples

# per cell: the sampled metrics get a median and an interval, the others a median over repeats
CI_METRICS = ["iteration_time_s", "bubble_ratio"]
OTHER_METRICS = ["throughput_tokens_s", "exposed_comm_s", "predicted_iteration_time_s",
                 "predicted_bubble_ratio"]


def axes(df: pd.DataFrame) -> list[str]:
    """The fields that vary across ``df``'s rows: swept parameters, then planned settings."""
    swept = columns.swept(list(df.columns))
    named = {c.rsplit(".", 1)[-1] for c in swept}
    settings = [c for c in columns.SETTINGS
                if c in df and c not in named and df[c].astype(str).nunique() > 1]
    return swept + settings


def _stats(run_dir: Path, rows: pd.DataFrame) -> dict:
    """Median, low and high of the CI metrics over all iterations of ``rows`` (ok rows), the
    median over rows of the others, and the number of iterations pooled."""
    out: dict = {}
    if not len(rows):
        return out
    s = samples(run_dir, rows)
    out["n"] = len(s["iteration_time_s"])
    for m in CI_METRICS:
        if s.get(m):
            out[m], out[m + "_lo"], out[m + "_hi"] = median_ci(s[m])
    for m in OTHER_METRICS:
        if m in rows and rows[m].notna().any():
            out[m] = float(rows[m].astype(float).median())
    return out


def cell_table(df: pd.DataFrame, run_dir: Path) -> pd.DataFrame:
    """One line per cell: its axis values, status (of the last repeat), iterations pooled,
    medians with interval bounds (``<metric>_lo`` / ``_hi``) and the prediction."""
    lines = []
    for cell_id, rows in df.groupby("cell_id", sort=False):
        line = {"cell_id": cell_id, **{a: rows[a].iloc[0] for a in axes(df)},
                "status": rows["status"].iloc[-1]}
        line.update(_stats(run_dir, rows[rows["status"] == "ok"]))
        lines.append(line)
    return pd.DataFrame(lines)


def axis_table(df: pd.DataFrame, run_dir: Path, axis: str) -> pd.DataFrame:
    """One line per value of ``axis`` over the ok rows: cells, pooled medians and intervals."""
    ok = df[df["status"] == "ok"]
    lines = []
    for value, rows in ok.groupby(ok[axis].astype(str), sort=False):
        lines.append({axis: value, "cells": rows["cell_id"].nunique(), **_stats(run_dir, rows)})
    return pd.DataFrame(lines)


def with_ci_text(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with each CI metric and its bounds merged into one text column
    'median [low, high]' (no interval below 6 values)."""
    out = table.copy()
    for m in CI_METRICS:
        if m not in out:
            continue
        out[m] = [_ci_text(v, lo, hi) for v, lo, hi in zip(out[m], out[m + "_lo"],
                                                           out[m + "_hi"])]
        out = out.drop(columns=[m + "_lo", m + "_hi"])
    return out.rename(columns={m: f"{m} (95% CI)" for m in CI_METRICS})


def _ci_text(v, lo, hi) -> str:
    if pd.isna(v):
        return ""
    if lo is None or pd.isna(lo):
        return f"{v:.4g} (no CI)"
    return f"{v:.4g} [{lo:.4g}, {hi:.4g}]"


def markdown(df: pd.DataFrame) -> str:
    """A markdown table; floats with 4 significant digits, missing values empty."""
    def fmt(v):
        if isinstance(v, float):
            return "" if pd.isna(v) else f"{v:.0f}" if abs(v) >= 1e4 else f"{v:.4g}"
        return str(v)
    head = "| " + " | ".join(df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule] + body)
