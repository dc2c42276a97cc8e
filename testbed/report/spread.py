"""Spread: the median of a metric with a 95 % confidence interval, over every measured
iteration of every repeat of a cell (or of every cell sharing an axis value).

The interval is the distribution-free order-statistic interval of the median: with the
``n`` values sorted, [x_(k), x_(n+1−k)] covers the true median with probability
1 − 2·P(B ≤ k−1), B ~ Binomial(n, 1/2); ``k`` is the largest with that coverage ≥ 95 %. It
needs n ≥ 6 (below, no interval is given). Iterations of one run are treated as independent
draws, which they are only roughly (a busy machine's slow spell spans several).

Samples come from ``cells/<id>/iterations.csv``; a run directory without them (older runs)
falls back to one value per row (the row's median).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from scipy.special import bdtr  # the binomial CDF (importing scipy.stats took 0.5-1.5 s)

from testbed.cell.celldir import CellDir
from testbed.runner.store import cell_path

LEVEL = 0.95
# per-iteration metrics: pooled over iterations and repeats
SAMPLED = ["iteration_time_s", "bubble_ratio", "exposed_comm_s"]


def median_ci(values: list[float], level: float = LEVEL) -> tuple[float, float | None,
                                                                   float | None]:
    """(median, low, high); low and high are None when ``values`` are too few for ``level``.
    Raises ValueError on no values."""
    v = sorted(float(x) for x in values)
    n = len(v)
    if not n:
        raise ValueError("no values")
    median = float(pd.Series(v).median())
    k = 0
    while k + 1 <= n // 2 and 2 * bdtr(k, n, 0.5) <= 1 - level:
        k += 1
    if k == 0:
        return median, None, None
    return median, v[k - 1], v[n - k]


def fmt_ci(values: list[float]) -> str:
    """'median [low, high]' (4 significant digits), or 'median (n=N: no CI)' when too few."""
    m, lo, hi = median_ci(values)
    if lo is None:
        return f"{m:.4g} (n={len(values)}: no CI)"
    return f"{m:.4g} [{lo:.4g}, {hi:.4g}]"


def iterations_of(run_dir: Path, cell_id: str, repeat: int) -> pd.DataFrame | None:
    """A cell × repeat's iterations.csv, or None when it has none."""
    path = Path(CellDir(cell_path(run_dir, cell_id, repeat)).iterations)
    return pd.read_csv(path) if path.is_file() else None


def samples(run_dir: Path, rows: pd.DataFrame) -> dict[str, list[float]]:
    """Per sampled metric, every measured iteration of ``rows`` (ok rows of results.csv);
    the row's own value for a row without iterations.csv."""
    out: dict[str, list[float]] = {m: [] for m in SAMPLED}
    for r in rows.itertuples(index=False):
        it = iterations_of(run_dir, r.cell_id, int(r.repeat))
        for m in SAMPLED:
            if it is not None and m in it:
                out[m] += [float(x) for x in it[m].dropna()]
            elif m in rows.columns and pd.notna(getattr(r, m)):
                out[m].append(float(getattr(r, m)))
    return out


def n_samples(run_dir: Path, rows: pd.DataFrame) -> int:
    return len(samples(run_dir, rows)["iteration_time_s"])
