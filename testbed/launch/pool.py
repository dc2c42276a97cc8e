"""The runner's side of the pre-started rank interpreter (``testbed.train.zygote``).

One zygote per sweep imports torch and the worker once; every rank of every cell on this machine
is then a fork of it that enters its host's network namespace, so a rank starts in milliseconds
and shares the imported pages instead of paying ~220 MB and seconds of CPU each. Ranks on lab
hosts (whose network namespace is not on this machine) are started as before.

``RankPool.start`` returns a ``testbed.process.ProcessHandle`` (``pid``, ``poll``, ``wait``,
``terminate``, ``kill``, ``returncode``): signals go through a pidfd, so a recycled pid is never
hit; exit codes come from the zygote, which reaps its children.
"""
from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import time
from pathlib import PurePath
from typing import Any

from testbed.errors import MachineError, WorkerError

log = logging.getLogger(__name__)

ZYGOTE_MODULE = "testbed.train.zygote"
READY_TIMEOUT_S = 120.0   # importing torch on a loaded 2-core machine can take a while
REPLY_TIMEOUT_S = 30.0


class PooledRank:
    """A rank forked by the zygote: a ``ProcessHandle`` the runner watches and stops."""

    def __init__(self, pool: "RankPool", pid: int):
        self.pool, self.pid = pool, pid
        self.returncode: int | None = None
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # already gone: its exit report is on its way
            self._pidfd = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.pool.pump()
            self.returncode = self.pool.exits.get(self.pid)
            if self.returncode is not None:
                self._close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
            self.pool.pump(0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None and self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class RankPool:
    """One zygote (started on first use, or early with ``warm``) that forks ranks into
    network namespaces on this machine. A context manager: closing it ends the zygote and,
    with it, any rank still running."""

    def __init__(self, python: str):
        self.python = python
        self.proc: subprocess.Popen | None = None
        self.exits: dict[int, int] = {}
        self._replies: list[dict[str, Any]] = []
        self._buf = b""
        self._next_id = 0
        self._ready = False

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def warm(self) -> None:
        """Start the zygote now (its imports then overlap whatever comes next)."""
        if self.proc is None:
            self.proc = subprocess.Popen([self.python, "-m", ZYGOTE_MODULE],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            os.set_blocking(self.proc.stdout.fileno(), False)

    def start(self, netns: str, module: str, args: list[str], env: dict[str, str],
              log_path: PurePath, cwd: PurePath | None = None) -> PooledRank:
        """Fork ``module``'s ``main(args)`` inside the network namespace at ``netns`` with
        ``env`` added, stdout and stderr appended to ``log_path``, in ``cwd``. Raises
        WorkerError when the zygote refuses or has died, MachineError when it never got ready."""
        self._await_ready()
        self._next_id += 1
        req = {"id": self._next_id, "module": module, "args": args, "env": env,
               "netns": netns, "log": str(log_path), "cwd": None if cwd is None else str(cwd)}
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as e:
            raise WorkerError(f"the rank zygote is gone ({e.strerror}); see its stderr") from None
        reply = self._reply(self._next_id)
        if "pid" not in reply:
            raise WorkerError(f"the rank zygote refused {module}: {reply.get('error')}")
        return PooledRank(self, reply["pid"])

    def pump(self, wait_s: float = 0.0) -> None:
        """Read whatever the zygote said (waiting up to ``wait_s`` for something)."""
        if self.proc is None:
            return
        out = self.proc.stdout
        if wait_s > 0:
            select.select([out], [], [], wait_s)
        try:
            chunk = out.read()
        except (BlockingIOError, ValueError):
            chunk = None
        if not chunk:
            return
        *lines, self._buf = (self._buf + chunk).split(b"\n")
        for line in lines:
            self._note(json.loads(line))

    def close(self) -> None:
        """End the zygote: closing its stdin lets it wait for its children; a zygote that does
        not end is killed (its children die with it: PR_SET_PDEATHSIG)."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _note(self, msg: dict[str, Any]) -> None:
        if "exit" in msg:
            self.exits[msg["pid"]] = msg["exit"]
        elif msg.get("ready"):
            self._ready = True
        else:
            self._replies.append(msg)

    def _await_ready(self) -> None:
        self.warm()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._ready:
            if self.proc.poll() is not None:
                raise MachineError(f"the rank zygote exited with {self.proc.returncode} before "
                                   "it was ready", f"try `{self.python} -m {ZYGOTE_MODULE}`")
            if time.monotonic() > deadline:
                raise MachineError(f"the rank zygote was not ready within {READY_TIMEOUT_S:g} s",
                                   "the machine may be overloaded")
            self.pump(0.1)

    def _reply(self, req_id: int) -> dict[str, Any]:
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while True:
            for i, msg in enumerate(self._replies):
                if msg.get("id") in (req_id, None):
                    return self._replies.pop(i)
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise WorkerError("the rank zygote did not answer (exit "
                                  f"{self.proc.poll()}); see the run log")
            self.pump(0.05)
