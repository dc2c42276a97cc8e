"""Test-suite helper: tests that measure time, or look at the whole machine, run alone.

Under pytest-xdist several tests run at once. Most of them wait (on emulated compute and
delays) rather than compute, so they share the machine well; but a test that compares a measured
time with a prediction, or asserts what exists on the whole machine, needs the machine to
itself. Those carry ``@pytest.mark.alone``.

Every test holds a lock on one file for its whole protocol (set-up, call, tear-down): a shared
lock for ordinary tests, an exclusive one for ``alone`` tests. An ``alone`` test first
registers: it holds an exclusive lock on a file of its own (``alone-<pid>``) from before it
waits for the main lock until it has run. An ordinary test starts only while no ``alone`` test
is registered, and polls until then. So once an ``alone`` test is waiting, no new test starts
until every registered one has run, however the lock's waiters happen to be woken. (A turnstile
lock, shared and exclusive waiters woken together, let an ordinary test overtake a queued
``alone`` test whenever it won that race: a 97 s test then held up a queued one.) A registration whose holder has died is
unlocked, and counts for nothing.

A *quiet* test takes no lock: one that needs neither root, torch, netem, SSH stand-ins nor
Mininet, so it builds no namespace, interface or qdisc and starts no torch process. What
disturbed the timing tests beside others was such kernel work (a fork of a process holding
torch, a namespace set up or torn down), not user-space CPU: four CPU hogs beside them did not
(results/suite/xdist-timing.md, 2026-11-27). The quiet tests run on one worker while the
``alone`` tests run, on the core those leave idle (tests/conftest.py, tests/startorder.py).
An ``apart_from_quiet`` test waits for the quiet group to end (``apart_from_quiet``).
"""
from __future__ import annotations

import fcntl
import os
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator


# a test carrying none of these marks is quiet
NOT_QUIET = ("root", "torch", "netem", "remote", "mininet", "alone")


def is_quiet(item) -> bool:
    """Whether ``item`` (a pytest item) may run beside an ``alone`` test: it carries none of
    ``NOT_QUIET``'s marks (marks, not keywords: a test's keywords hold its folders' names)."""
    return not any(item.get_closest_marker(name) is not None for name in NOT_QUIET)


@contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextmanager
def machine_share(directory: Path, *, alone: bool, quiet: bool = False) -> Iterator[None]:
    """Hold the machine shared (``alone=False``) or exclusively while the block runs; a quiet
    test (``quiet=True``) holds nothing."""
    main = directory / "machine"
    if quiet:
        yield
        return
    if alone:
        with _flock(directory / f"{_ALONE}{os.getpid()}", fcntl.LOCK_EX), \
                _flock(main, fcntl.LOCK_EX):
            yield
        return
    fd = os.open(main, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            with _flock(directory / "check", fcntl.LOCK_EX):  # one ordinary test checks at a time
                if not alone_registered(directory):
                    fcntl.flock(fd, fcntl.LOCK_SH)
                    break
            time.sleep(POLL_S)
        yield
    finally:
        os.close(fd)


_ALONE = "alone-"
POLL_S = 0.1  # an ordinary test's wait between looks at the registrations
# Held by the worker that runs the quiet group, from its first quiet test until its next test
# is not one, and taken by every ``apart_from_quiet`` test: those never run beside the group.
QUIET_LOCK = "quiet-group"


class QuietSpan:
    """The quiet group's hold on ``QUIET_LOCK``, on the worker that runs it: taken around its
    first quiet test and let go after the last of a run of them."""

    def __init__(self, directory: Path):
        self.path, self.held, self.holding = directory / QUIET_LOCK, ExitStack(), False

    @contextmanager
    def around(self, *, quiet: bool, next_quiet: bool) -> Iterator[None]:
        """Run one test: a quiet one holds the lock (taken if not yet held), and lets it go
        after it unless the test after it (``next_quiet``) is quiet too."""
        if quiet and not self.holding:
            self.held.enter_context(_flock(self.path, fcntl.LOCK_EX))
            self.holding = True
        try:
            yield
        finally:
            if quiet and not next_quiet:
                self.held.close()
                self.holding = False


@contextmanager
def apart_from_quiet(directory: Path) -> Iterator[None]:
    """Wait until the quiet group has run, and keep it from running while the block runs.

    The quiet tests compute on one core and the user-mode kernel of the netem tests is among
    them: beside it single delay-line releases came 1-9 ms late, and a cell's CPU-bound compute
    beside the quiet tests stretched as its control run's had. A test whose bound is a few
    milliseconds, or that compares CPU-bound compute between two runs, takes this before it
    waits for the machine (an ``alone`` test registers only then), so the other ``alone`` tests
    go on meanwhile."""
    with _flock(directory / QUIET_LOCK, fcntl.LOCK_EX):
        yield


def alone_registered(directory: Path) -> bool:
    """Whether an ``alone`` test is waiting or running: a registration file some live process
    holds locked."""
    return any(is_held(path) for path in directory.glob(f"{_ALONE}*"))


def is_held(path: Path) -> bool:
    """Whether some process holds an exclusive lock on ``path`` (False if it does not exist)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
