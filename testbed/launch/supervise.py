"""Waiting for a cell's worker processes and naming the rank that really failed.

When one rank dies its peers fail soon after ("connection closed by peer"), and whichever exit
the poll sees first need not be the cause. So after the first failure the others get a short
grace to finish on their own; then the failed rank whose trace ended earliest (every worker
writes an ``end`` record with its monotonic time) is reported, with its last log lines. A rank
killed by a signal wrote no ``end`` record: it is the cause, named at once, without the grace.
A part of the harness that died (``check``: the rank interpreter, a delay line) comes before
any rank: the ranks' failures are its consequence.
"""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Callable

from testbed.errors import WorkerError
from testbed.cell.celldir import CellDir
from testbed.process import ProcessHandle, describe_exit, stop_process
from testbed.traceformat import read_trace

POLL_S = 0.05
SETTLE_S = 2.0          # after a failure, how long peers get to fail (or finish) themselves
ERROR_TAIL_LINES = 3
# a program whose ranks have all traced their last iteration gets this long to exit before it
# is stopped and noted as hung at exit (its interpreter's and torch's shutdown take 1-3 s on a
# busy 2-core machine)
EXIT_GRACE_S = 10.0
LOOK_S = 0.5  # how often the traces are read for finished ranks (they are on disk)


def last_error(log_path: Path) -> str:
    """The last non-empty lines of a worker log (where the worker prints its one-line error)."""
    try:
        lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return " | ".join(lines[-ERROR_TAIL_LINES:]) or "no output"


def _ended_at(cell_dir: CellDir, rank: int) -> float:
    """Monotonic time of the rank's ``end`` record; +inf when it has none (killed)."""
    try:
        ends = [r["t"] for r in read_trace(cell_dir.trace(rank)) if r.get("type") == "end"]
    except (OSError, KeyError, ValueError):
        return float("inf")
    return ends[-1] if ends else float("inf")


def watch_workers(procs: dict[int, ProcessHandle], timeout_s: float, cell_dir: Path,
                  check: Callable[[], None] | None = None,
                  finished: Callable[[], set[int]] | None = None) -> dict[int, str]:
    """Wait for every worker. A failure or the timeout stops the rest (none outlives the call)
    and raises WorkerError naming the rank that failed first and its last log lines. ``check``
    is called every poll and once more before a rank's failure or the timeout is reported;
    what it raises (a dead part: the rank interpreter, a delay line) stops the workers too and
    is raised instead.

    ``finished`` (a program's cell) says which ranks have traced all their iterations. Once
    every rank has, a rank that hangs at exit is stopped after ``EXIT_GRACE_S`` and a rank that
    fails at exit does not fail the cell: the measured iterations stand, and the returned
    notes (rank → what happened at exit) say so. Returns {} when every rank exited with 0."""
    cell_dir = CellDir(cell_dir)
    deadline = time.monotonic() + timeout_s
    all_done_at, next_look = None, 0.0
    try:
        while any(p.poll() is None for p in procs.values()):
            if check is not None:
                check()
            now = time.monotonic()
            if finished is not None and all_done_at is None and now >= next_look:
                next_look = now + LOOK_S
                all_done_at = now if finished() >= set(procs) else None
            if all_done_at is None and any(p.poll() not in (None, 0) for p in procs.values()):
                break
            if now > deadline or (all_done_at is not None and now > all_done_at + EXIT_GRACE_S):
                break
            time.sleep(POLL_S)
        if check is not None:
            check()
        if finished is not None and finished() >= set(procs):
            grace_end = (all_done_at or time.monotonic()) + EXIT_GRACE_S
            while time.monotonic() < grace_end and any(p.poll() is None for p in procs.values()):
                time.sleep(POLL_S)
            return _exit_notes(procs)
        running = sorted(r for r, p in procs.items() if p.poll() is None)
        if running and not any(p.poll() not in (None, 0) for p in procs.values()):
            raise WorkerError(f"timed out after {timeout_s:g} s; ranks still running: "
                              f"{running}")
        failed = {r: p.returncode for r, p in procs.items() if p.poll() not in (None, 0)}
        if not failed:
            return {}
        settle = time.monotonic() + (0 if min(failed.values()) < 0 else SETTLE_S)
        while time.monotonic() < settle and any(p.poll() is None for p in procs.values()):
            if check is not None:
                check()
            time.sleep(POLL_S)
        failed = {r: p.returncode for r, p in procs.items() if p.poll() not in (None, 0)}
        first = min(failed, key=lambda r: (failed[r] >= 0, _ended_at(cell_dir, r), r))
        others = f" ({len(failed) - 1} other rank(s) failed after it)" if len(failed) > 1 else ""
        pid = "" if procs[first].pid is None else f" (pid {procs[first].pid})"
        raise WorkerError(f"rank {first} {describe_exit(failed[first])}{pid}: "
                          f"{last_error(cell_dir.worker_log(first))}{others}")
    finally:
        for p in procs.values():
            stop_process(p)


def _exit_notes(procs: dict[int, ProcessHandle]) -> dict[int, str]:
    """What each rank that had finished its iterations did at exit, when not a clean 0."""
    notes = {}
    for r, p in sorted(procs.items()):
        code = p.poll()
        if code is None:
            notes[r] = f"hung at exit (stopped {EXIT_GRACE_S:g} s after the last rank finished)"
        elif code != 0:
            notes[r] = f"exited with {code} after its last iteration"
    return notes


def start_logged(argv: list[str], env: dict[str, str], log_path: Path,
                 cwd: Path | None = None) -> subprocess.Popen:
    """Start ``argv`` on this machine (in ``cwd``; None: this process's) with ``env`` added to
    this process's environment, its stdout and stderr into ``log_path``."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(argv, env=dict(os.environ, **env), stdout=log, stderr=log,
                                cwd=cwd)
