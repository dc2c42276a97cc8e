"""Argument parsing and dispatch only; the work lives in the other modules."""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.table import Table

from testbed import __version__
from testbed.errors import EXIT_BAD_INPUT, EXIT_OK, SpecError

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree; each subparser sets ``func``."""
    parser = argparse.ArgumentParser(
        prog="python -m testbed",
        description="Network emulation testbed for geo-distributed LLM training.")
    parser.add_argument("--version", action="version", version=f"testbed {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add(sub, "validate", "check an experiment file (no root needed); exit 2 on problems",
         _validate).add_argument("experiment", type=Path, nargs="+")
    _add(sub, "plan", "list the cells an experiment file expands to, with their ids",
         _plan).add_argument("experiment", type=Path)
    _add(sub, "probe", "report what this machine can do and what 'auto' would pick", _probe)
    sp = _add(sub, "schema", "print the JSON Schema of the experiment file", _schema)
    sp.add_argument("--output", "-o", type=Path, help="write to this file instead of stdout")
    for register in _plugins():
        register(sub)
    return parser


def _plugins() -> list[Callable]:
    """Subcommand groups that live with their subsystems (network, runner), where present."""
    out = []
    for module in ("testbed.net.cli", "testbed.runner.cli", "testbed.sim.cli"):
        try:
            present = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # its package is not there yet
            present = False
        if present:
            out.append(importlib.import_module(module).add_subcommands)
    return out


def _add(sub, name: str, help_text: str, func: Handler) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text, description=help_text)
    p.set_defaults(func=func)
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; returns its exit code."""
    args = build_parser().parse_args(argv)
    return args.func(args)


def _validate(args: argparse.Namespace) -> int:
    from testbed.spec import load_experiment

    failed: list[SpecError] = []
    for path in args.experiment:
        try:
            le = load_experiment(path)
            print(f"{path}: ok ({len(le.cells)} cells × {le.experiment.repeat} repeats)")
        except SpecError as e:
            failed.append(e)
            print(str(e), file=sys.stderr)
    if failed:
        n = sum(len(e.problems) for e in failed)
        print(f"{n} problem{'s' if n != 1 else ''} found", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


def _plan(args: argparse.Namespace) -> int:
    from testbed.spec import load_experiment

    le = load_experiment(args.experiment)
    print_plan(le, Console())
    return EXIT_OK


def print_plan(le, console: Console) -> None:
    """Print the cells of a loaded experiment as a table."""
    exp = le.experiment
    axes = list(le.cells[0].params) if le.cells else []
    table = Table(title=f"{exp.name}: {len(le.cells)} cells × {exp.repeat} repeats "
                        f"(backend {exp.backend}, shaper {exp.shaper}, topology {exp.topology.name})")
    table.add_column("#", justify="right")
    table.add_column("cell id")
    for a in axes:
        table.add_column(a)
    for c in le.cells:
        table.add_row(str(c.index), c.cell_id, *(str(c.params[a]) for a in axes))
    console.print(table)


def _probe(args: argparse.Namespace) -> int:
    from testbed.probe import print_report, probe

    report = probe()
    print_report(report, Console())
    return report.exit_code


def _schema(args: argparse.Namespace) -> int:
    from testbed.spec import json_schema

    text = json.dumps(json_schema(), indent=2)
    if args.output:
        args.output.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    return EXIT_OK
