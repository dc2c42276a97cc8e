"""Argument parsing and dispatch only: each command group registers its own subcommands; the
work lives in the other packages."""
from __future__ import annotations

import argparse

from testbed import __version__
from testbed.cli import experiment, run
from testbed.cli import net as net_commands
from testbed.cli import optical as optical_commands
from testbed.cli import schedule as schedule_commands
from testbed.cli import simulate as simulate_commands

COMMAND_GROUPS = (experiment, run, net_commands, simulate_commands, schedule_commands,
                  optical_commands)


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree; each subparser sets ``func``."""
    parser = argparse.ArgumentParser(
        prog="python -m testbed",
        description="Network emulation testbed for geo-distributed LLM training.")
    parser.add_argument("--version", action="version", version=f"testbed {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.add_subcommands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; returns its exit code."""
    args = build_parser().parse_args(argv)
    return args.func(args)
