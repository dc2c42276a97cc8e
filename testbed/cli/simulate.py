"""``simulate EXP.yaml``: predicted iteration time, bubble, exposed communication and memory
for every cell of an experiment (no root, no network, seconds)."""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Callable, Iterator

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


MAX_TABLE_ROWS = 200
EXHAUSTIVE_TIMELINE_RANKS = 256


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
    p.add_argument("--parquet", type=Path, metavar="FILE",
                   help="the same rows as a Parquet table (per-stage lists as list columns)")
    p.add_argument("--jobs", "-j", type=int, metavar="N",
                   help="simulate in N processes (default: one per core)")
    p.add_argument("--max-rows", type=int, default=MAX_TABLE_ROWS, metavar="N",
                   help=f"print at most N cells' rows (default {MAX_TABLE_ROWS}; every row "
                        "goes to --csv/--json/--parquet)")
    p.set_defaults(func=_simulate)


def _simulate(args: argparse.Namespace) -> int:
    from testbed.plan import plan_all
    from testbed.plan.predictsweep import predict_cells
    from testbed.spec import load_experiment

    if args.memory_limit is not None and args.memory_limit < 1:
        raise SpecError([Problem("--memory-limit", 0, 0, "", "must be at least 1 microbatch")])
    if args.jobs is not None and args.jobs < 1:
        raise SpecError([Problem("--jobs", 0, 0, "", "must be at least 1 process")])
    for flag, out in (("--csv", args.csv), ("--json", args.json), ("--parquet", args.parquet)):
        if out is not None and not out.parent.is_dir():
            raise SpecError([Problem(str(out), 0, 0, flag, f"no directory {out.parent}")])
    le = load_experiment(args.experiment)
    with _progress() as tick:
        records = predict_cells(le, args.jobs, tick)
    if args.memory_limit is not None:
        for r in records:
            r["predicted_memory_ok"] = r["predicted_peak_inflight"] <= args.memory_limit
    console = Console(width=None if sys.stdout.isatty() else 160)  # logs: no squeezing
    console.print(_table(le, records, args.memory_limit, args.max_rows))
    if len(records) > args.max_rows:
        console.print(f"{len(records) - args.max_rows} more cells: see --csv, --json or "
                      "--parquet", highlight=False)
    if args.csv:
        with writing(args.csv):
            _write_csv(records, args.csv)
    if args.json:
        with writing(args.json):
            args.json.write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    if args.parquet:
        with writing(args.parquet):
            _write_parquet(records, args.parquet)
    if args.timeline:
        with writing(args.timeline):
            chosen = [c for c in le.cells if args.cell in (None, c.cell_id)][:1]
            return _write_timeline(le, plan_all(le, chosen) if chosen else [], args.cell,
                                   args.timeline)
    return EXIT_OK


@contextmanager
def _progress() -> Iterator[Callable[[int, int], None]]:
    """A progress bar with the time left on stderr, shown once there is more than one plan
    to simulate."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    bar = Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                   console=Console(stderr=True), transient=True)
    task = None

    def tick(done: int, total: int) -> None:
        nonlocal task
        if total < 2:
            return
        if task is None:
            bar.start()
            task = bar.add_task("cells", total=total)
        bar.update(task, completed=done)

    try:
        yield tick
    finally:
        bar.stop()


def _write_parquet(records: list[dict[str, Any]], out: Path) -> None:
    import pandas as pd

    pd.DataFrame.from_records(records).to_parquet(out, index=False)


def _write_csv(records: list[dict[str, Any]], out: Path) -> None:
    """One row per cell; list values (per stage) as space-separated numbers."""
    fields = list(dict.fromkeys(k for r in records for k in r))
    with out.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in records:
            w.writerow({k: _fmt(v) if isinstance(v, list) else v for k, v in r.items()})


def _table(le, records, memory_limit: int | None, max_rows: int) -> Table:
    axes = list(le.cells[0].params) if le.cells else []
    t = Table(title=f"{le.experiment.name}: predicted, {len(records)} cells")
    for name in ["cell id", *(a.rsplit(".", 1)[-1] for a in axes), *COLUMNS.values()]:
        t.add_column(name, no_wrap=True)
    if memory_limit is not None:
        t.add_column(f"≤ {memory_limit} in flight")
    for pred in records[:max_rows]:
        values = [_fmt(pred[k]) for k in COLUMNS]
        if memory_limit is not None:
            values.append("yes" if pred["predicted_memory_ok"] else "[red]NO[/red]")
        t.add_row(pred["cell_id"], *(str(pred[a]) for a in axes), *values)
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
    inp = chosen[0].sim_input()
    # every ring step as its own span where the picture can show them
    inp.exhaustive = len(chosen[0].slots) <= EXHAUSTIVE_TIMELINE_RANKS
    res = run(inp)
    if out.suffix == ".json":
        spans = [s._asdict() for s in res.spans]
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

