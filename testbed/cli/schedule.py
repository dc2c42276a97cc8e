"""``schedule export NAME --pp P --microbatches M [--chunks C] -o FILE.csv``: a built-in
schedule in torch.distributed.pipelining's compute-only CSV format, to start your own from
(``workload.schedule_file``). No root, no torch."""
from __future__ import annotations

import argparse
from pathlib import Path

from testbed.errors import EXIT_OK, Problem, SpecError
from testbed.schedule.csvfile import write_csv
from testbed.schedule.generators import generate
from testbed.schedule.registry import CROSS_DC_SCHEDULES, SCHEDULES, schedule_problems


def add_subcommands(sub) -> None:
    """Register ``schedule export``."""
    p = sub.add_parser("schedule", help="export built-in schedules as CSV",
                       description="Work with schedules as files (workload.schedule_file).")
    ops = p.add_subparsers(dest="schedule_command", required=True, metavar="SUBCOMMAND")
    e = ops.add_parser("export", help="write a built-in schedule as a compute-only CSV",
                       description="Write a built-in schedule in torch.distributed.pipelining's "
                                   "compute-only CSV format (one row per rank).")
    e.add_argument("name", help="one of: " + ", ".join(SCHEDULES))
    e.add_argument("--pp", type=int, required=True, help="pipeline ranks")
    e.add_argument("--microbatches", type=int, required=True)
    e.add_argument("--chunks", type=int, default=1, help="virtual stages per rank (default 1)")
    e.add_argument("-o", "--output", type=Path, required=True, metavar="FILE.csv")
    e.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    problems = [Problem("schedule export", 0, 0, f"--{fld}", msg) for fld, msg in
                _problems(args.name, args.pp, args.chunks, args.microbatches)]
    if problems:
        raise SpecError(problems)
    schedule = generate(args.name, args.pp, args.microbatches, args.chunks)
    try:
        write_csv(schedule, args.output)
    except OSError as e:
        raise SpecError([Problem(str(args.output), 0, 0, "--output",
                                 f"cannot write: {e.strerror}")]) from None
    print(f"{args.name} (pp={args.pp}, chunks={args.chunks}, microbatches={args.microbatches})"
          f": {args.output}")
    return EXIT_OK


def _problems(name: str, pp: int, chunks: int, microbatches: int) -> list[tuple[str, str]]:
    if name in CROSS_DC_SCHEDULES:
        return [("name", f"{name} is built per cell from the placed links; export one of: "
                         f"{', '.join(SCHEDULES)}")]
    if pp < 1 or chunks < 1 or microbatches < 1:
        return [("pp", "pp, chunks and microbatches must be at least 1")]
    return schedule_problems(name, pp, chunks, microbatches)
