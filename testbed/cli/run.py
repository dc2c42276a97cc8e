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
    p.add_argument("--cold", action="store_true",
                   help="start every cell from scratch: a new network, new worker processes "
                        "and a new link measurement per cell (slower; for comparison)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from testbed.runner.report import axis_tables, build_report, results_table
    from testbed.runner.run import Interrupted, RunOptions, run_experiment

    console = Console(width=None if sys.stdout.isatty() else 120)  # CI logs: no squeezing
    if args.dry_run:
        le = load_experiment(args.experiment)
        print_plan(le, plan_all(le), console)
        return EXIT_OK
    if os.geteuid() != 0:
        raise MachineError("`run` needs root (namespaces, tc, iptables)",
                           "run it as root, e.g. sudo .venv/bin/python -m testbed run …")
    opts = RunOptions(results=args.results, resume=args.resume, only=args.only, quiet=args.quiet,
                      cold=args.cold)
    try:
        code, store = run_experiment(args.experiment, opts, console)
    except Interrupted as e:
        console.print(f"stopped by {e}; finished rows are kept. Continue with: "
                      f"--resume <run dir>")
        return 130
    if store.rows:
        try:
            build_report(store.root)
        finally:
            store.hand_over()  # summary.md and plots/: the sudo user's, as the rest of the run
        _print_results(console, store, results_table(store.frame(), store.root),
                       axis_tables(store.frame(), store.root))
    return code


# one column's frame in a rich table: a space of padding each side and a rule
_FRAME = 3
# end-table headers: short names for the metrics (the rest: the last part of a dotted name)
_TITLES = {"n": "iters", "iteration_time_s": "iter s", "iteration_time_s_ci": "95% CI",
           "bubble_ratio": "bubble", "bubble_ratio_ci": "95% CI",
           "throughput_tokens_s": "tokens/s", "exposed_comm_s": "comm wait s",
           "predicted_iteration_time_s": "pred iter s", "predicted_bubble_ratio": "pred bubble"}


def _print_results(console: Console, store, table, by_axis=()) -> None:
    """The end-of-run tables, per cell and per axis value (medians with their 95 %
    interval): every number whole at the console's width (headers wrap; when the columns do
    not fit side by side they are split over several tables, each led by the first column)."""
    _print_table(console, "results", _end_cells(table))
    for axis, t in by_axis:
        _print_table(console, f"by {axis.rsplit('.', 1)[-1]}", _end_cells(t))
    console.print(f"csv: {store.csv_path}")
    console.print(f"summary: {store.root / 'summary.md'}")
    console.print(f"plots: {store.root / 'plots'}")


def _print_table(console: Console, title: str, cells: dict[str, list[str]]) -> None:
    width = console.width or 120
    parts = _fit(cells, width)
    for part in parts:
        t = Table(title=title if part is parts[0] else f"{title} (continued)")
        for c, w in zip(part, _widths(cells, part, width)):
            t.add_column(_title(c), overflow="fold", width=w)
        for i in range(len(cells[part[0]])):
            t.add_row(*(cells[c][i] for c in part))
        console.print(t)


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
    """The columns split into groups that fit ``width`` (each led by the first column)."""
    def need(c: str) -> int:
        return _least(cells, c) + _FRAME
    first = next(iter(cells))
    lead, rest = [first], [c for c in cells if c != first]
    groups, used = [list(lead)], 1 + need(first)
    for c in rest:
        if used + need(c) > width and len(groups[-1]) > 1:
            groups.append(list(lead))
            used = 1 + need(first)
        groups[-1].append(c)
        used += need(c)
    return groups


def _title(c: str) -> str:
    return _TITLES.get(c, c.rsplit(".", 1)[-1])


def _least(cells: dict[str, list[str]], c: str) -> int:
    """A column's least width: its longest value, and its header's longest word."""
    return max([len(v) for v in cells[c]] + [max(map(len, _title(c).split()))])


def _widths(cells: dict[str, list[str]], part: list[str], width: int) -> list[int]:
    """Each column's width: its least, then what is left of ``width`` given to headers
    that would otherwise wrap, in column order."""
    out = [_least(cells, c) for c in part]
    left = width - 1 - sum(w + _FRAME for w in out)
    for k, c in enumerate(part):
        extra = max(0, min(left, len(_title(c)) - out[k]))
        out[k] += extra
        left -= extra
    return out


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

    store = RunStore.open(args.run_dir)  # a clear error when it is not a run directory
    try:
        written = build_report(args.run_dir)
    finally:  # under sudo, what report wrote is the user's (not the rest of the directory)
        for path in (store.root / "summary.md", store.root / "plots"):
            store.hand_over(path)
    for path in written:
        print(path)
    return EXIT_OK
