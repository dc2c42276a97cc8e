"""Waiting for a cell's worker processes and naming the rank that really failed.

When one rank dies its peers fail soon after ("connection closed by peer"), and whichever exit
the poll sees first need not be the cause. So after the first failure the others get a short
grace to finish on their own; then the failed rank whose trace ended earliest (every worker
writes an ``end`` record with its monotonic time) is reported, with its last log lines.
"""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Callable

from testbed.errors import WorkerError
from testbed.launch.celldir import CellDir
from testbed.traceformat import read_trace

POLL_S = 0.05
STOP_GRACE_S = 3.0      # SIGTERM → SIGKILL, for every process the project starts
SETTLE_S = 2.0          # after a failure, how long peers get to fail (or finish) themselves
ERROR_TAIL_LINES = 3


def stop_process(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; reaps it. A finished process is left alone."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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


def watch_workers(procs: dict[int, subprocess.Popen], timeout_s: float, cell_dir: Path,
                  check: Callable[[], None] | None = None) -> None:
    """Wait for every worker. A failure or the timeout stops the rest (none outlives the call)
    and raises WorkerError naming the rank that failed first and its last log lines. ``check``
    is called every poll; what it raises (e.g. a dead delay line) stops the workers too."""
    cell_dir = CellDir(cell_dir)
    deadline = time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in procs.values()):
            if check is not None:
                check()
            if any(p.poll() not in (None, 0) for p in procs.values()):
                break
            if time.monotonic() > deadline:
                running = sorted(r for r, p in procs.items() if p.poll() is None)
                raise WorkerError(f"timed out after {timeout_s:g} s; ranks still running: "
                                  f"{running}")
            time.sleep(POLL_S)
        failed = {r: p.returncode for r, p in procs.items() if p.poll() not in (None, 0)}
        if not failed:
            return
        settle = time.monotonic() + SETTLE_S
        while time.monotonic() < settle and any(p.poll() is None for p in procs.values()):
            time.sleep(POLL_S)
        failed = {r: p.returncode for r, p in procs.items() if p.poll() not in (None, 0)}
        first = min(failed, key=lambda r: (_ended_at(cell_dir, r), r))
        others = f" ({len(failed) - 1} other rank(s) failed after it)" if len(failed) > 1 else ""
        raise WorkerError(f"rank {first} exited with {failed[first]}: "
                          f"{last_error(cell_dir.worker_log(first))}{others}")
    finally:
        for p in procs.values():
            stop_process(p)


def start_logged(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """Start ``argv`` on this machine with ``env`` added to this process's environment, its
    stdout and stderr into ``log_path``."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(argv, env=dict(os.environ, **env), stdout=log, stderr=log)
