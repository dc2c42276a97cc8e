"""A started process, whichever kind it is, and how the project stops one.

Three kinds of process handle exist: ``subprocess.Popen`` (a process started on this machine),
``PooledRank`` (a rank forked by the pre-started interpreter, ``testbed.launch.pool``) and
``RemoteProcess`` (a process on a lab host over SSH, ``testbed.net.lab.process``). Whoever
watches or stops workers sees only their common face, :class:`ProcessHandle`.
"""
from __future__ import annotations

import subprocess
from typing import Protocol

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


def stop_process(proc: ProcessHandle, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; reaps it. A finished process is left alone."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
