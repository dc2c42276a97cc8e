"""``run`` and ``report`` subcommands."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from testbed.cli.experiment import print_plan
from testbed.errors import EXIT_OK, MachineError
from testbed.plan import plan_all
from testbed.spec import load_experiment

# The runner, its store and its report load pandas and matplotlib (seconds on a busy machine):
# they are imported when `run` or `report` runs, so that every other command starts fast.


def add_subcommands(sub) -> None:
    """Register ``report`` and ``run``."""
    r = sub.add_parser("report", help="rebuild summary.md and plots/ from a run's results.csv",
                       description="Rebuild summary.md and plots/ from RUN_DIR/results.csv.")
    r.add_argument("run_dir", type=Path)
    r.set_defaults(func=_report)
    p = sub.add_parser("run", help="run an experiment: every cell of its matrix",
                       description="Build the network, run the workers and write results for "
                                   "every cell. Needs root.")
    p.add_argument("experiment", type=Path)
    p.add_argument("--results", type=Path, default=Path("results"),
                   help="output root (default: results/)")
    p.add_argument("--resume", type=Path, metavar="RUN_DIR",
                   help="continue a run: skip cells that already have an ok row")
    p.add_argument("--only", nargs="+", metavar="CELL_ID", default=[],
                   help="run only these cells (ids from `plan`)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from testbed.runner.report import build_report, results_table
    from testbed.runner.run import Interrupted, RunOptions, run_experiment

    console = Console(width=None if sys.stdout.isatty() else 120)  # CI logs: no squeezing
    if args.dry_run:
        le = load_experiment(args.experiment)
        print_plan(le, plan_all(le), console)
        return EXIT_OK
    if os.geteuid() != 0:
        raise MachineError("`run` needs root (namespaces, tc, iptables)",
                           "run it as root, e.g. sudo .venv/bin/python -m testbed run …")
    opts = RunOptions(results=args.results, resume=args.resume, only=args.only, quiet=args.quiet)
    try:
        code, store = run_experiment(args.experiment, opts, console)
    except Interrupted as e:
        console.print(f"stopped by {e}; finished rows are kept. Continue with: "
                      f"--resume <run dir>")
        return 130
    if store.rows:
        build_report(store.root)
        _print_results(console, store, results_table(store.frame(), store.root))
    return code


# one column's frame in a rich table: a space of padding each side and a rule
_FRAME = 3
# end-table headers: short names for the metrics (the rest: the last part of a dotted name)
_TITLES = {"n": "iters", "iteration_time_s": "iter s", "iteration_time_s_ci": "iter s 95% CI",
           "bubble_ratio": "bubble", "bubble_ratio_ci": "bubble 95% CI",
           "throughput_tokens_s": "tokens/s", "exposed_comm_s": "comm wait s",
           "predicted_iteration_time_s": "pred iter s", "predicted_bubble_ratio": "pred bubble"}


def _print_results(console: Console, store, table) -> None:
    """The end-of-run table: every number whole at the console's width (headers wrap; when
    the columns do not fit side by side they are split over several tables, each led by the
    cell id)."""
    cells = _end_cells(table)
    width = console.width or 120
    parts = _fit(cells, width)
    for part in parts:
        t = Table(title="results" if part is parts[0] else "results (continued)")
        for c in part:
            t.add_column(_TITLES.get(c, c.rsplit(".", 1)[-1]), overflow="fold",
                         min_width=max(len(v) for v in cells[c]) if cells[c] else None)
        for i in range(len(cells["cell_id"])):
            t.add_row(*(cells[c][i] for c in part))
        console.print(t)
    console.print(f"csv: {store.csv_path}")
    console.print(f"summary: {store.root / 'summary.md'}")
    console.print(f"plots: {store.root / 'plots'}")


def _end_cells(table) -> dict[str, list[str]]:
    """Column name → the text of each line, in the order shown; a metric's interval bounds
    become one '[low, high]' column after it."""
    out: dict[str, list[str]] = {}
    for c in table.columns:
        if c.endswith(("_lo", "_hi")):
            continue
        out[c] = [_cell(v) for v in table[c]]
        if f"{c}_lo" in table:
            out[f"{c}_ci"] = [_interval(lo, hi) for lo, hi in zip(table[f"{c}_lo"],
                                                                 table[f"{c}_hi"])]
    return out


def _fit(cells: dict[str, list[str]], width: int) -> list[list[str]]:
    """The columns split into groups that fit ``width`` (each group led by cell_id)."""
    def need(c: str) -> int:
        words = _TITLES.get(c, c.rsplit(".", 1)[-1]).split()
        return max([len(v) for v in cells[c]] + [max(map(len, words))]) + _FRAME
    lead, rest = ["cell_id"], [c for c in cells if c != "cell_id"]
    groups, used = [list(lead)], 1 + need("cell_id")
    for c in rest:
        if used + need(c) > width and len(groups[-1]) > 1:
            groups.append(list(lead))
            used = 1 + need("cell_id")
        groups[-1].append(c)
        used += need(c)
    return groups


def _interval(lo, hi) -> str:
    if lo is None or hi is None or lo != lo or hi != hi:
        return "n<6"
    return f"[{_cell(lo)}, {_cell(hi)}]"


def _cell(v) -> str:
    if isinstance(v, float):
        if v != v:
            return ""
        return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.3f}"
    return str(v)


def _report(args: argparse.Namespace) -> int:
    from testbed.runner.report import build_report
    from testbed.runner.store import RunStore

    RunStore.open(args.run_dir)  # a clear error when it is not a run directory
    for path in build_report(args.run_dir):
        print(path)
    return EXIT_OK
