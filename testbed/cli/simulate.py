"""``simulate EXP.yaml``: predicted iteration time, bubble, exposed communication and memory
for every cell of an experiment (no root, no network, seconds)."""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from testbed.errors import EXIT_OK, Problem, SpecError, writing

COLUMNS = {  # predict() key → column title
    "predicted_iteration_time_s": "iter s",
    "predicted_bubble_ratio": "bubble",
    "predicted_bubble_ratio_max": "bubble max",
    "predicted_exposed_comm_s": "comm wait s",
    "predicted_peak_inflight_per_stage": "in flight per stage",
}


def add_subcommands(sub) -> None:
    """Register ``simulate``."""
    p = sub.add_parser("simulate", help="predict every cell's timeline (discrete-event model)",
                       description="Predict iteration time, bubble ratio, exposed communication "
                                   "and peak in-flight activations of every cell, without "
                                   "running anything. No root needed.")
    p.add_argument("experiment", type=Path)
    p.add_argument("--memory-limit", type=int, metavar="N",
                   help="flag cells where a stage holds more than N microbatches of activations")
    p.add_argument("--timeline", type=Path, metavar="OUT",
                   help="write one cell's predicted timeline: .json (spans) or .png (plot)")
    p.add_argument("--cell", metavar="CELL_ID",
                   help="the cell for --timeline (default: the first)")
    p.add_argument("--csv", type=Path, metavar="FILE",
                   help="also write one row per cell: cell id, swept parameters, predicted_* "
                        "columns and schedule_rule")
    p.add_argument("--json", type=Path, metavar="FILE",
                   help="the same rows as a JSON list of objects")
    p.set_defaults(func=_simulate)


def _simulate(args: argparse.Namespace) -> int:
    from testbed.plan import plan_all
    from testbed.spec import load_experiment

    if args.memory_limit is not None and args.memory_limit < 1:
        raise SpecError([Problem("--memory-limit", 0, 0, "", "must be at least 1 microbatch")])
    for flag, out in (("--csv", args.csv), ("--json", args.json)):
        if out is not None and not out.parent.is_dir():
            raise SpecError([Problem(str(out), 0, 0, flag, f"no directory {out.parent}")])
    le = load_experiment(args.experiment)
    plans = plan_all(le)
    rows = [(p.cell, _predict_cell(p, args.memory_limit)) for p in plans]
    console = Console(width=None if sys.stdout.isatty() else 160)  # logs: no squeezing
    console.print(_table(le, rows, args.memory_limit))
    records = [{"cell_id": c.cell_id, **c.params, **pred} for c, pred in rows]
    if args.csv:
        with writing(args.csv):
            _write_csv(records, args.csv)
    if args.json:
        with writing(args.json):
            args.json.write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    if args.timeline:
        with writing(args.timeline):
            return _write_timeline(le, plans, args.cell, args.timeline)
    return EXIT_OK


def _predict_cell(plan, memory_limit: int | None) -> dict[str, Any]:
    """``predict`` of a cell's plan, plus ``schedule_rule``: which of its generator's variants
    the schedule is (``crosspipe_greedy``: the rule that won; else empty). Raises
    SimulationError when the cell cannot be simulated."""
    from testbed.plan import predict

    return {**predict(plan, memory_limit), "schedule_rule": plan.schedule.variant}


def _write_csv(records: list[dict[str, Any]], out: Path) -> None:
    """One row per cell; list values (per stage) as space-separated numbers."""
    fields = list(dict.fromkeys(k for r in records for k in r))
    with out.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in records:
            w.writerow({k: _fmt(v) if isinstance(v, list) else v for k, v in r.items()})


def _table(le, rows, memory_limit: int | None) -> Table:
    axes = list(le.cells[0].params) if le.cells else []
    t = Table(title=f"{le.experiment.name}: predicted, {len(rows)} cells")
    for name in ["cell id", *(a.rsplit(".", 1)[-1] for a in axes), *COLUMNS.values()]:
        t.add_column(name, no_wrap=True)
    if memory_limit is not None:
        t.add_column(f"≤ {memory_limit} in flight")
    for cell, pred in rows:
        values = [_fmt(pred[k]) for k in COLUMNS]
        if memory_limit is not None:
            values.append("yes" if pred["predicted_memory_ok"] else "[red]NO[/red]")
        t.add_row(cell.cell_id, *(str(cell.params[a]) for a in axes), *values)
    return t


def _fmt(v) -> str:
    if isinstance(v, list):
        return " ".join(map(str, v))
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _write_timeline(le, plans, cell_id: str | None, out: Path) -> int:
    from testbed.sim import run

    chosen = [p for p in plans if cell_id in (None, p.cell.cell_id)]
    if not chosen:
        ids = ", ".join(c.cell_id for c in le.cells)
        raise SpecError([Problem(str(le.path), 0, 0, "--cell", f"no cell {cell_id!r}; "
                                                                f"cells: {ids}")])
    cell = chosen[0].cell
    res = run(chosen[0].sim_input())
    if out.suffix == ".json":
        spans = [vars(s) for s in res.spans]
        out.write_text(json.dumps({"cell_id": cell.cell_id, "params": cell.params,
                                   "span_s": res.span_s, "spans": spans}, indent=1),
                       encoding="utf-8")
    elif out.suffix == ".png":
        _plot(res, out, f"{cell.cell_id} {cell.label} (predicted)")
    else:
        raise SpecError([Problem(str(out), 0, 0, "--timeline", "write .json or .png")])
    print(f"timeline of {cell.cell_id}: {out}")
    return EXIT_OK


def _plot(res, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"F": "tab:blue", "B": "tab:green", "I": "tab:olive", "W": "tab:purple"}
    fig, ax = plt.subplots(figsize=(12, 0.5 + 0.45 * (max(s.rank for s in res.spans) + 1)))
    for s in res.spans:
        if s.cat == "compute" or (s.cat == "wait" and s.t1 > s.t0):
            colour = colours.get(s.kind, "tab:red") if s.cat == "compute" else "lightgrey"
            ax.barh(s.rank, s.t1 - s.t0, left=s.t0, color=colour, edgecolor="white",
                    linewidth=0.3)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_ylabel("rank")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)

