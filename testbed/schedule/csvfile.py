"""Schedules from files: torch.distributed.pipelining's compute-only CSV, or a Python function.

The CSV is what torch 2.13's ``_PipelineScheduleRuntime._dump_csv(f, format="compute_only")``
writes and ``_load_csv`` reads: one row per pipeline rank (row r = rank r), one action per
column (``0F3`` = virtual stage 0, forward, microbatch 3; ``B`` full backward, ``I``/``W`` its
input/weight halves). An empty cell is an idle slot (torch writes its ``None`` actions so) and
is skipped. Ranks own the stages they run, as torch infers them.

A ``.py`` file defines ``schedule(pp, chunks, microbatches, context)`` returning one list of
action strings per rank (``context`` is the cell's ``CrossDCContext``, or None when the
compute times are unknown); see :data:`PY_FUNCTION`.

Every problem is a ``FileProblem`` with a 1-based line and column in the file; what a schedule
must satisfy is checked in ``testbed.schedule.filecheck``.
"""
from __future__ import annotations

import csv
import io
import os
import runpy
import stat
from pathlib import Path
from typing import Any, Callable

from testbed.schedule.filecheck import (FileProblem, Located, Shape, deadlock_problems,
                                        memory_problems, owners, shape_problems)
from testbed.schedule.ir import Action, Kind, Schedule

PY_FUNCTION = "schedule"
MAX_SCHEDULE_BYTES = 4 << 20  # 4 MiB: 128 ranks × 4096 microbatches × 3 actions fit
COMPUTE = (Kind.F, Kind.B, Kind.I, Kind.W)


class ScheduleFileError(ValueError):
    """A schedule file that cannot be used; ``problems`` lists every problem found."""

    def __init__(self, path: Path, problems: list[FileProblem]):
        self.path, self.problems = Path(path), problems
        super().__init__("; ".join(f"{path}:{p.line}:{p.column}: {p.message}" for p in problems))


# ---------------------------------------------------------------- reading


def _text(path: Path) -> str:
    """The file's text; raises ScheduleFileError when it is unreadable, not a regular file,
    over MAX_SCHEDULE_BYTES or not UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ScheduleFileError(path, [FileProblem(1, 1, "not a regular file")])
            data = f.read(MAX_SCHEDULE_BYTES + 1)
    except OSError as e:
        raise ScheduleFileError(path, [FileProblem(1, 1, f"cannot read: {e.strerror}")]) from None
    if len(data) > MAX_SCHEDULE_BYTES:
        raise ScheduleFileError(path, [FileProblem(1, 1, f"larger than {MAX_SCHEDULE_BYTES} "
                                                         "bytes")])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ScheduleFileError(path, [FileProblem(1, 1, f"not UTF-8 (byte {e.start})")]) from None


def _cells(text: str) -> list[list[tuple[str, int, int]]]:
    """Per non-empty row: (cell text, line, column) of each cell, columns counted in
    characters. Actions never need quoting, so a plain split keeps every position."""
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        row, col = [], 1
        for cell in line.split(","):
            stripped = cell.strip().strip('"')
            row.append((stripped, n, col + len(cell) - len(cell.lstrip())))
            col += len(cell) + 1
        rows.append(row)
    return rows




def _parse_rows(rows: list[list[tuple[str, int, int]]],
                problems: list[FileProblem]) -> tuple[list[list[Action]], Located]:
    """Actions per rank and where each one is written; malformed or non-compute actions are
    reported."""
    actions: list[list[Action]] = []
    where: Located = {}
    for row in rows:
        acts = []
        for text, line, col in row:
            if not text:
                continue  # an idle slot
            try:
                a = Action.parse(text)
            except ValueError:
                problems.append(FileProblem(line, col, f"{text!r} is not an action (expected "
                                            "<stage><F|B|I|W><microbatch>, e.g. 0F3)"))
                continue
            if a.kind not in COMPUTE:
                problems.append(FileProblem(line, col, f"{text!r}: a compute-only schedule has "
                                            "F, B, I and W actions only (SEND/RECV are added "
                                            "by lowering)"))
                continue
            if a in where:
                was = where[a]
                problems.append(FileProblem(line, col, f"{a} is repeated (first at line "
                                            f"{was[0]}, column {was[1]})"))
                continue
            where[a] = (line, col)
            acts.append(a)
        actions.append(acts)
    return actions, where


def read_csv(path: Path, shape: Shape, name: str | None = None) -> Schedule:
    """Read and check a compute-only CSV schedule; raises ScheduleFileError listing every
    problem (with line and column) when it is not a complete, runnable schedule of ``shape``."""
    path = Path(path)
    rows = _cells(_text(path))
    problems: list[FileProblem] = []
    actions, where = _parse_rows(rows, problems)
    last = (rows[-1][0][1] + 1) if rows else 1
    return _checked(path, actions, where, shape, name or path.name, problems, last)


def load_py(path: Path, shape: Shape, context: Any = None, name: str | None = None) -> Schedule:
    """Run a ``.py`` schedule file's ``schedule(pp, chunks, microbatches, context)`` and check
    its result like a CSV's (positions: line 1 = rank 0, column = action index + 1, as if it
    were written as CSV). Raises ScheduleFileError when it cannot be run or is not valid."""
    path = Path(path)
    fn = _py_function(path)
    try:
        result = fn(shape.pp, shape.chunks, shape.microbatches, context)
        rows = [[(str(a), r + 1, i + 1) for i, a in enumerate(acts)]
                for r, acts in enumerate(result)]
    except Exception as e:  # noqa: BLE001 — the user's code: report, never a traceback
        raise ScheduleFileError(path, [FileProblem(1, 1, f"{PY_FUNCTION}() raised "
                                                         f"{type(e).__name__}: {e}")]) from None
    problems: list[FileProblem] = []
    actions, where = _parse_rows(rows, problems)
    return _checked(path, actions, where, shape, name or path.name, problems, len(rows) + 1)


def _py_function(path: Path) -> Callable:
    try:
        namespace = runpy.run_path(str(path))
    except Exception as e:  # noqa: BLE001 — the user's code: report, never a traceback
        line = getattr(e, "lineno", None) or 1
        raise ScheduleFileError(path, [FileProblem(line, 1, f"cannot load: "
                                                            f"{type(e).__name__}: {e}")]) from None
    fn = namespace.get(PY_FUNCTION)
    if not callable(fn):
        raise ScheduleFileError(path, [FileProblem(1, 1, f"defines no function {PY_FUNCTION}"
                                                         "(pp, chunks, microbatches, context)")])
    return fn


def _checked(path: Path, actions: list[list[Action]], where: Located, shape: Shape, name: str,
             problems: list[FileProblem], after_last: int) -> Schedule:
    problems += shape_problems(actions, where, shape, after_last)
    if problems:
        raise ScheduleFileError(path, problems)
    owner = owners(actions, shape.n_stages)
    schedule = Schedule(name, shape.pp, shape.n_stages, shape.microbatches, owner, actions)
    problems += deadlock_problems(schedule, where) or memory_problems(schedule, where,
                                                                      shape.memory_limit)
    if problems:
        raise ScheduleFileError(path, problems)
    return schedule


# ---------------------------------------------------------------- writing


def to_csv(schedule: Schedule) -> str:
    """The compute-only CSV text (what torch's ``_dump_csv(format="compute_only")`` writes
    for the same order: one row per rank, actions comma-separated)."""
    buf = io.StringIO(newline="")
    writer = csv.writer(buf, lineterminator="\r\n")
    for row in schedule.to_rows():
        writer.writerow(row)
    return buf.getvalue()


def write_csv(schedule: Schedule, path: Path) -> Path:
    """Write ``to_csv(schedule)`` to ``path``; returns it."""
    Path(path).write_text(to_csv(schedule), encoding="utf-8", newline="")
    return Path(path)
