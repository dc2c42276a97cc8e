"""A started process, whichever kind it is, and how the project stops one.

Three kinds of process handle exist: ``subprocess.Popen`` (a process started on this machine),
``PooledRank`` (a rank forked by the pre-started interpreter, ``testbed.launch.pool``) and
``RemoteProcess`` (a process on a lab host over SSH, ``testbed.net.lab.process``). Whoever
watches or stops workers sees only their common face, :class:`ProcessHandle`.
"""
from __future__ import annotations

import logging
import signal
import subprocess
import time
from typing import Protocol

log = logging.getLogger(__name__)

STOP_GRACE_S = 3.0      # SIGTERM → SIGKILL, for every process the project starts


class ProcessHandle(Protocol):
    """The part of ``subprocess.Popen`` the project uses: ``wait`` raises
    ``subprocess.TimeoutExpired`` when ``timeout`` passes; ``pid`` may be None while a remote
    process has not reported it yet."""

    @property
    def pid(self) -> int | None: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


def describe_exit(code: int) -> str:
    """How a process ended, in words: ``exited with 3``, ``died with signal 9 (SIGKILL)``
    (a negative code is a signal, as subprocess reports it)."""
    if code >= 0:
        return f"exited with {code}"
    try:
        name = f" ({signal.Signals(-code).name})"
    except ValueError:
        name = ""
    return f"died with signal {-code}{name}"


def stop_processes(procs: list, grace_s: float = STOP_GRACE_S) -> None:
    """``stop_process`` of every handle at once: all get SIGTERM, those still running
    ``grace_s`` later SIGKILL; each is reaped, waiting at most ``grace_s`` after the SIGKILL.
    Works on any ProcessHandle, on this machine or another."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        p.terminate()
    deadline = time.monotonic() + grace_s
    stragglers = []
    for p in running:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            stragglers.append(p)
    deadline = time.monotonic() + grace_s
    for p in stragglers:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("pid %s still runs %g s after SIGKILL", p.pid, grace_s)


def stop_process(proc: ProcessHandle, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; reaps it, waiting at most ``grace_s`` after
    the SIGKILL (what still runs then is the ledger's: teardown and ``clean`` stop it). A
    finished process is left alone."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            log.warning("pid %s still runs %g s after SIGKILL", proc.pid, grace_s)
