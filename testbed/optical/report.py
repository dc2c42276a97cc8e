"""An optical sweep's outputs: ``results.csv`` (one row per cell), ``plot.png`` and
``comparison.md`` (each routing policy with CBA's rule against without it, beside the gains
CBA's journal paper reports)."""
from __future__ import annotations

import csv
import math
from pathlib import Path

from testbed.errors import writing
from testbed.optical.sweep import COLUMNS

# CBA (CD-CBA, JOCN 2026): best iteration-time gain (GPipe), blocking reduction (typical, best)
PUBLISHED = {"iteration_time_pct": -31.25, "blocking_pct": -13.20, "blocking_best_pct": -19.33}


def write_csv(rows: list[dict], path: Path) -> None:
    with writing(path):
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(COLUMNS))
            w.writeheader()
            w.writerows(rows)


def _pct(new: float, old: float) -> float:
    return (new - old) / old * 100 if old and not math.isnan(old) and not math.isnan(new) \
        else float("nan")


def cba_pairs(rows: list[dict]) -> list[dict]:
    """For each routing policy P with a ``P+cba`` row in the same cell: the change (%) of
    iteration time and of the job's and all requests' blocking."""
    key = {(r["policy"], r["load"], r["schedule"], r["microbatches"]): r for r in rows}
    out = []
    for (policy, load, sched, m), row in key.items():
        base = key.get((policy.removesuffix("+cba"), load, sched, m))
        if not policy.endswith("+cba") or base is None:
            continue
        out.append({"routing": base["policy"], "load": load, "schedule": sched,
                    "microbatches": m,
                    "iteration_time_pct": _pct(row["iteration_time_s"], base["iteration_time_s"]),
                    "blocking_job_pct": _pct(row["blocking_job"], base["blocking_job"]),
                    "blocking_all_pct": _pct(row["blocking_all"], base["blocking_all"])})
    return out


def _least(values) -> float:
    """The smallest of ``values`` that is a number; nan when none is."""
    return min((v for v in values if not math.isnan(v)), default=float("nan"))


def _fmt(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:+.2f} %"


def comparison_md(rows: list[dict]) -> str:
    pairs = cba_pairs(rows)
    lines = ["# CBA's rule against the same routing without it", "",
             "Change with CBA (negative: CBA better). Published (CD-CBA, JOCN 2026): iteration "
             f"time {PUBLISHED['iteration_time_pct']:+.2f} % at best (GPipe), blocking "
             f"{PUBLISHED['blocking_pct']:+.2f} % (up to {PUBLISHED['blocking_best_pct']:+.2f} %).",
             "", "| routing | load | schedule | microbatches | iteration time | job blocking "
             "| all blocking |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for p in pairs:
        lines.append(f"| {p['routing']} | {p['load']:g} | {p['schedule']} | {p['microbatches']} "
                     f"| {_fmt(p['iteration_time_pct'])} | {_fmt(p['blocking_job_pct'])} "
                     f"| {_fmt(p['blocking_all_pct'])} |")
    if pairs:
        best = _least(p["iteration_time_pct"] for p in pairs)
        best_blk = _least(p["blocking_all_pct"] for p in pairs)
        lines += ["", f"Best iteration-time change here: {_fmt(best)} (published "
                      f"{PUBLISHED['iteration_time_pct']:+.2f} %); best change of all requests' "
                      f"blocking: {_fmt(best_blk)} (published {PUBLISHED['blocking_pct']:+.2f} %, "
                      f"up to {PUBLISHED['blocking_best_pct']:+.2f} %)."]
    return "\n".join(lines) + "\n"


_METRICS = (("iteration_time_s", "iteration time (s)"), ("blocking_job", "job blocking"),
            ("bubble_ratio", "bubble ratio"))


def _grid(rows: list[dict], x: str, title, path: Path, xlabel: str, log2: bool) -> None:
    """One column per schedule, one row per metric, one line per policy against ``x``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    schedules = list(dict.fromkeys(r["schedule"] for r in rows))
    fig, axes = plt.subplots(len(_METRICS), len(schedules), squeeze=False,
                             figsize=(4.5 * len(schedules), 8), sharex=True)
    for col, sched in enumerate(schedules):
        for policy in dict.fromkeys(r["policy"] for r in rows):
            mine = sorted((r for r in rows if r["schedule"] == sched and r["policy"] == policy),
                          key=lambda r: r[x])
            for row_i, (metric, label) in enumerate(_METRICS):
                ax = axes[row_i][col]
                ax.plot([r[x] for r in mine], [r[metric] for r in mine], marker="o",
                        label=policy, linestyle="--" if "+cba" in policy else "-")
                ax.set_ylabel(label)
        axes[0][col].set_title(title(sched))
        axes[-1][col].set_xlabel(xlabel)
        if log2:
            axes[-1][col].set_xscale("log", base=2)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    with writing(path):
        fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(rows: list[dict], path: Path) -> None:
    """Iteration time, job blocking and bubble ratio against microbatches, one line per
    policy, one column per schedule, at the first load."""
    load = rows[0]["load"]
    _grid([r for r in rows if r["load"] == load], "microbatches",
          lambda sched: f"{sched} (load {load:g})", path, "microbatches", log2=True)


def plot_load(rows: list[dict], path: Path) -> None:
    """The same against the background load, at the most microbatches swept."""
    m = max(r["microbatches"] for r in rows)
    _grid([r for r in rows if r["microbatches"] == m], "load",
          lambda sched: f"{sched} (m = {m})", path, "background load", log2=False)
