"""Test-suite helper: tests that measure time, or look at the whole machine, run alone.

Under pytest-xdist several tests run at once. Most of them wait (on emulated compute and
delays) rather than compute, so they share the machine well; but a test that compares a measured
time with a prediction, or asserts what exists on the whole machine, needs the machine to
itself. Those carry ``@pytest.mark.alone``.

Every test holds a lock on one file for its whole protocol (set-up, call, tear-down): a shared
lock for ordinary tests, an exclusive one for ``alone`` tests. A second file is a turnstile that
gives waiting exclusive tests priority: a shared holder passes through it before taking the main
lock, so once an ``alone`` test is queued no new test starts until it has run.
"""
from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextmanager
def machine_share(directory: Path, *, alone: bool) -> Iterator[None]:
    """Hold the machine shared (``alone=False``) or exclusively while the block runs."""
    turnstile, main = directory / "turnstile", directory / "machine"
    if alone:
        with _flock(turnstile, fcntl.LOCK_EX), _flock(main, fcntl.LOCK_EX):
            yield
        return
    fd = os.open(main, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        with _flock(turnstile, fcntl.LOCK_SH):
            fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)
