"""``run`` and ``report`` subcommands (the end-of-run tables: ``testbed.report.console``)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console

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
    p.add_argument("--quiet", action="store_true",
                   help="no progress output and no end tables: only where the csv, summary "
                        "and plots are (and errors)")
    p.add_argument("--cold", action="store_true",
                   help="start every cell from scratch: a new network, new worker processes "
                        "and a new link measurement per cell (slower; for comparison)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    console = Console(width=None if sys.stdout.isatty() else 120)  # CI logs: no squeezing
    if args.dry_run:
        le = load_experiment(args.experiment)
        print_plan(le, plan_all(le), console)
        return EXIT_OK
    if os.geteuid() != 0:
        raise MachineError("`run` needs root (namespaces, tc, iptables)",
                           "run it as root, e.g. sudo .venv/bin/python -m testbed run …")
    le = load_experiment(args.experiment)  # a bad file is refused before the heavy imports
    from testbed.runner.run import Interrupted, RunOptions, run_experiment

    opts = RunOptions(results=args.results, resume=args.resume, only=args.only, quiet=args.quiet,
                      cold=args.cold)
    try:
        code, store = run_experiment(le, opts, console)
    except Interrupted as e:
        console.print(f"stopped by {e}; finished rows are kept. Continue with: "
                      f"--resume <run dir>")
        return 130
    if store.rows:
        from testbed.report.console import print_results
        from testbed.report.report import axis_tables, build_report, results_table

        try:
            build_report(store.root)
        finally:
            store.hand_over()  # summary.md and plots/: the sudo user's, as the rest of the run
        print_results(console, store, results_table(store.frame(), store.root),
                      axis_tables(store.frame(), store.root), tables=not args.quiet)
    return code


def _report(args: argparse.Namespace) -> int:
    from testbed.report.report import build_report
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
