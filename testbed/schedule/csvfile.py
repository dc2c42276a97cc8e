"""Schedules from files: torch.distributed.pipelining's compute-only CSV, or a Python function.

The CSV is what torch 2.13's ``_PipelineScheduleRuntime._dump_csv(f, format="compute_only")``
writes and ``_load_csv`` reads: one row per pipeline rank (row r = rank r), one action per
column (``0F3`` = virtual stage 0, forward, microbatch 3; ``B`` full backward, ``I``/``W`` its
input/weight halves). An empty cell is an idle slot (torch writes its ``None`` actions so) and
is skipped. Ranks own the stages they run, as torch infers them.

A ``.py`` file defines ``schedule(pp, chunks, microbatches, context)`` returning one list of
action strings per rank (``context`` is the cell's ``CrossDCContext``, or None when the
compute times are unknown); see :data:`PY_FUNCTION`.

Every problem is a :class:`FileProblem` with a 1-based line and column in the file.
"""
from __future__ import annotations

import csv
import io
import os
import runpy
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from testbed.schedule.ir import Action, Kind, Schedule

PY_FUNCTION = "schedule"
MAX_SCHEDULE_BYTES = 4 << 20  # 4 MiB: 128 ranks × 4096 microbatches × 3 actions fit
COMPUTE = (Kind.F, Kind.B, Kind.I, Kind.W)


@dataclass(frozen=True)
class FileProblem:
    """A problem in a schedule file at ``line``:``column`` (1-based)."""

    line: int
    column: int
    message: str


class ScheduleFileError(ValueError):
    """A schedule file that cannot be used; ``problems`` lists every problem found."""

    def __init__(self, path: Path, problems: list[FileProblem]):
        self.path, self.problems = Path(path), problems
        super().__init__("; ".join(f"{path}:{p.line}:{p.column}: {p.message}" for p in problems))


@dataclass(frozen=True)
class Shape:
    """What the workload asks of the schedule."""

    pp: int
    chunks: int
    microbatches: int
    memory_limit: int | None = None

    @property
    def n_stages(self) -> int:
        return self.pp * self.chunks


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


Located = dict[Action, tuple[int, int]]


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
    problems += _shape_problems(actions, where, shape, after_last)
    if problems:
        raise ScheduleFileError(path, problems)
    owner = _owners(actions, shape.n_stages)
    schedule = Schedule(name, shape.pp, shape.n_stages, shape.microbatches, owner, actions)
    problems += deadlock_problems(schedule, where) or memory_problems(schedule, where,
                                                                      shape.memory_limit)
    if problems:
        raise ScheduleFileError(path, problems)
    return schedule


# ---------------------------------------------------------------- checks


def _shape_problems(actions: list[list[Action]], where: Located, shape: Shape,
                    after_last: int) -> list[FileProblem]:
    """Rows ≠ pp, stages ≠ pp × chunks, stages run by two ranks, microbatches out of range,
    and every (stage, microbatch) whose F or backward is missing."""
    if len(actions) != shape.pp:
        line = shape.pp + 1 if len(actions) > shape.pp else after_last
        return [FileProblem(line, 1, f"{len(actions)} rows (ranks), the workload has "
                                     f"pp={shape.pp}")]
    out = []
    for a, (line, col) in where.items():
        if a.stage >= shape.n_stages:
            out.append(FileProblem(line, col, f"{a}: stage {a.stage} out of range; pp={shape.pp}"
                                              f" × chunks={shape.chunks} = {shape.n_stages} "
                                              "stages (0-based)"))
        elif a.microbatch >= shape.microbatches:
            out.append(FileProblem(line, col, f"{a}: microbatch {a.microbatch} out of range; "
                                              f"microbatches={shape.microbatches} (0-based)"))
    out += _ownership_problems(actions, where)
    return out or _missing(actions, where, shape)


def _ownership_problems(actions: list[list[Action]], where: Located) -> list[FileProblem]:
    first: dict[int, int] = {}
    out = []
    for rank, acts in enumerate(actions):
        for a in acts:
            r = first.setdefault(a.stage, rank)
            if r != rank:
                out.append(FileProblem(*where[a], f"{a}: stage {a.stage} is already run by rank "
                                                  f"{r} (row {r + 1}); one rank per stage"))
                first[a.stage] = rank  # report each extra owner once
    return out


def _missing(actions: list[list[Action]], where: Located, shape: Shape) -> list[FileProblem]:
    """Each (stage, microbatch) needs one F and either one B or one I and one W."""
    have = set(where)
    out = []
    stages = {a.stage: r for r, acts in enumerate(actions) for a in acts}
    for s in range(shape.n_stages):
        if s not in stages:
            out.append(FileProblem(1, 1, f"stage {s} appears in no row: pp={shape.pp} × "
                                         f"chunks={shape.chunks} = {shape.n_stages} stages"))
            continue
        for m in range(shape.microbatches):
            need = _needed(have, s, m)
            if need:
                line = stages[s] + 1
                out.append(FileProblem(line, 1, f"rank {stages[s]} (row {line}) lacks "
                                                f"{' and '.join(need)} (stage {s}, "
                                                f"microbatch {m})"))
    return out


def _needed(have: set[Action], s: int, m: int) -> list[str]:
    out = [] if Action(s, Kind.F, m) in have else [str(Action(s, Kind.F, m))]
    full, i, w = (Action(s, k, m) in have for k in (Kind.B, Kind.I, Kind.W))
    if full and (i or w):
        out.append(f"one backward: {Action(s, Kind.B, m)} or {Action(s, Kind.I, m)} + "
                   f"{Action(s, Kind.W, m)}, not both")
    elif not full and not (i and w):
        out.append(f"{Action(s, Kind.B, m)} (or {Action(s, Kind.I, m)} and "
                   f"{Action(s, Kind.W, m)})")
    return out


def _owners(actions: list[list[Action]], n_stages: int) -> list[int]:
    owner = [0] * n_stages
    for rank, acts in enumerate(actions):
        for a in acts:
            owner[a.stage] = rank
    return owner


def _deps(a: Action, n_stages: int) -> list:
    """What ``a`` waits for: actions, or ``("grad", s, m)`` = stage s's input gradient of
    microbatch m (its B or its I), which a backward of stage s−1 needs."""
    if a.kind is Kind.F:
        return [Action(a.stage - 1, Kind.F, a.microbatch)] if a.stage > 0 else []
    if a.kind is Kind.W:
        return [Action(a.stage, Kind.I, a.microbatch)]
    deps = [Action(a.stage, Kind.F, a.microbatch)]
    if a.stage < n_stages - 1:
        deps.append(("grad", a.stage + 1, a.microbatch))
    return deps


def deadlock_problems(schedule: Schedule, where: Located) -> list[FileProblem]:
    """Run every rank's order as far as its dependencies allow; each rank left waiting is a
    problem at the action it waits on (empty when the order completes)."""
    done: set = set()
    pos = [0] * schedule.pp
    progressed = True
    while progressed:
        progressed = False
        for r, acts in enumerate(schedule.actions):
            while pos[r] < len(acts) and all(d in done for d in _deps(acts[pos[r]],
                                                                        schedule.n_stages)):
                a = acts[pos[r]]
                done.add(a)
                if a.kind in (Kind.B, Kind.I):
                    done.add(("grad", a.stage, a.microbatch))
                pos[r], progressed = pos[r] + 1, True
    return [FileProblem(*where[acts[pos[r]]], f"deadlock: rank {r} waits forever at "
                                              f"{acts[pos[r]]} (needs "
                                              f"{_need_text(acts[pos[r]], schedule.n_stages)})")
            for r, acts in enumerate(schedule.actions) if pos[r] < len(acts)]


def _need_text(a: Action, n: int) -> str:
    return ", ".join(str(d) if isinstance(d, Action) else f"{d[1]}B{d[2]}/{d[1]}I{d[2]}"
                     for d in _deps(a, n))


def memory_problems(schedule: Schedule, where: Located,
                    memory_limit: int | None) -> list[FileProblem]:
    """Activations held per stage (F to its last backward action, as the simulator counts) in
    each rank's order; the first F over ``memory_limit`` is a problem."""
    if memory_limit is None:
        return []
    release = {(a.stage, a.microbatch): a.kind for acts in schedule.actions for a in acts
               if a.kind in (Kind.B, Kind.W)}
    for acts in schedule.actions:
        live: dict[int, int] = {}
        for a in acts:
            if a.kind is Kind.F:
                live[a.stage] = live.get(a.stage, 0) + 1
                if live[a.stage] > memory_limit:
                    return [FileProblem(*where[a], f"{a}: stage {a.stage} holds "
                                                   f"{live[a.stage]} microbatches of activations, "
                                                   f"over memory_limit={memory_limit}")]
            elif release.get((a.stage, a.microbatch)) is a.kind:
                live[a.stage] -= 1
    return []


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
