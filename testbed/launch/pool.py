"""The runner's side of the pre-started rank interpreter (``testbed.train.zygote``).

One zygote per sweep imports torch and the worker once; every rank of every cell on this machine
is then a fork of it that enters its host's network namespace, so a rank starts in milliseconds
and shares the imported pages instead of paying ~220 MB and seconds of CPU each. Ranks on lab
hosts (whose network namespace is not on this machine) are started as before.

``RankPool.start`` returns a ``testbed.process.ProcessHandle`` (``pid``, ``poll``, ``wait``,
``terminate``, ``kill``, ``returncode``): signals go through a pidfd, so a recycled pid is never
hit; exit codes come from the zygote, which reaps its children.

The zygote is a part that can die (killed, out of memory). Its death is seen at once: its
stdout reaches its end and ``check_alive`` raises a ``WorkerError`` naming it; its ranks die
with it (PR_SET_PDEATHSIG), and a rank whose exit it never reported is seen ended through its
pidfd. No wait here is without a deadline. ``warm`` replaces a zygote that died, so the next
cell gets a new one.
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
from testbed.process import STOP_GRACE_S, describe_exit
from testbed.train.zygote import TORCH_EXECUTOR, WORKER_ENTRY

log = logging.getLogger(__name__)

ZYGOTE_MODULE = "testbed.train.zygote"
READY_TIMEOUT_S = 120.0   # importing torch on a loaded 2-core machine can take a while
REPLY_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 5.0     # a zygote told to end waits for its children first
# A rank whose zygote died unreported was killed by PR_SET_PDEATHSIG (or ended just before; its
# real code went with the zygote): it is reported as killed.
ORPHAN_EXIT = -signal.SIGKILL


class PooledRank:
    """A rank forked by the zygote: a ``ProcessHandle`` the runner watches and stops."""

    def __init__(self, pool: "RankPool", pid: int):
        self.pool, self.pid = pool, pid
        self.zygote = pool.proc  # the zygote that forked it (reports its exit)
        self.returncode: int | None = None
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # already gone: its exit report is on its way
            self._pidfd = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.pool.pump()
            code = self.pool.exits.get(self.pid) if self.pool.proc is self.zygote else None
            if code is None and self.pool.lost(self.zygote) and self._ended():
                code = ORPHAN_EXIT
            self.returncode = code
            if code is not None:
                self._close()
        return self.returncode

    def _ended(self) -> bool:
        """Whether the process has ended, whoever reaps it (its pidfd is readable)."""
        return self._pidfd is None or bool(select.select([self._pidfd], [], [], 0)[0])

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
            if self.pool.lost(self.zygote):
                select.select([self._pidfd], [], [], 0.05)
            else:
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

    def __init__(self, python: str, warm: tuple[str, ...] = (TORCH_EXECUTOR,),
                 entries: tuple[str, ...] = (), env: dict[str, str] | None = None):
        """``entries``: the modules whose ``main`` ranks run (default: the built-in worker);
        ``warm``: modules only imported; ``env``: added to the zygote's environment."""
        self.python, self.warm_modules, self.entries = python, warm, entries
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self.exits: dict[int, int] = {}
        self._replies: list[dict[str, Any]] = []
        self._buf = b""
        self._next_id = 0
        self._ready = False
        self._eof = False  # the zygote's stdout ended: it is dying or dead

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def warm(self) -> None:
        """Start the zygote now (its imports then overlap whatever comes next); a zygote that
        died is replaced."""
        if self.proc is not None and (self._eof or self.proc.poll() is not None):
            log.warning("%s; starting a new one", self._death())
            self._forget()
        if self.proc is None:
            argv = [self.python, "-m", ZYGOTE_MODULE,
                    *(a for e in self.entries for a in ("--entry", e)), *self.warm_modules]
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         env=dict(os.environ, **self.env))
            os.set_blocking(self.proc.stdout.fileno(), False)
            log.info("rank interpreter started (pid %d), importing %s", self.proc.pid,
                     ", ".join((self.entries or (WORKER_ENTRY,)) + self.warm_modules))

    def check_alive(self) -> None:
        """Cheap check, polled while a cell's ranks run: raises WorkerError naming the zygote
        when it has died (its ranks died with it)."""
        if self.proc is not None and self.proc.poll() is not None:
            raise self._death()

    def lost(self, zygote: subprocess.Popen | None) -> bool:
        """Whether ``zygote`` will report nothing more: it died (its stdout ended) or was
        replaced."""
        return zygote is not self.proc or self._eof

    def start(self, netns: str | None, module: str, args: list[str], env: dict[str, str],
              log_path: PurePath, cwd: PurePath | None = None,
              fresh: bool = False) -> PooledRank:
        """Fork ``module``'s ``main(args)`` inside the network namespace at ``netns`` (None:
        the zygote's own) with ``env`` added, stdout and stderr appended to ``log_path``, in
        ``cwd``; ``fresh``: made to look like a new interpreter (a user's program, see
        ``testbed.train.zygote``). Raises WorkerError when the zygote refuses or has died,
        MachineError when it never got ready."""
        self._await_ready()
        self._next_id += 1
        req = {"id": self._next_id, "module": module, "args": args, "env": env,
               "netns": netns, "log": str(log_path), "cwd": None if cwd is None else str(cwd),
               "fresh": fresh}
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            raise self._death() from None
        reply = self._reply(self._next_id)
        if "pid" not in reply:
            raise WorkerError(f"the rank interpreter refused {module}: {reply.get('error')}")
        return PooledRank(self, reply["pid"])

    def pump(self, wait_s: float = 0.0) -> None:
        """Read whatever the zygote said (waiting up to ``wait_s`` for something)."""
        if self.proc is None or self._eof:
            time.sleep(wait_s)  # nothing more will come
            return
        out = self.proc.stdout
        if wait_s > 0:
            select.select([out], [], [], wait_s)
        try:
            chunk = out.read()
        except (BlockingIOError, ValueError):
            chunk = None
        if chunk == b"":
            self._eof = True
            return
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
        proc = self.proc
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass  # killed by _forget
        self._forget()

    def _forget(self) -> None:
        """Kill the zygote if it still runs, reap it (waiting at most STOP_GRACE_S) and drop
        its state."""
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.kill()
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            log.warning("the rank interpreter (pid %d) still runs %g s after SIGKILL",
                        proc.pid, STOP_GRACE_S)
        self.exits.clear()
        self._replies.clear()
        self._buf, self._ready, self._eof = b"", False, False

    def _death(self) -> WorkerError:
        """The error naming the zygote that died, with how it ended (its exit is waited for
        briefly: its pipes close a moment before it can be reaped)."""
        try:
            code = self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return WorkerError(f"the rank interpreter (pid {self.proc.pid}) closed its pipes: "
                               "it is dying")
        return WorkerError(f"the rank interpreter (pid {self.proc.pid}) {describe_exit(code)}")

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
                raise MachineError(f"the rank interpreter (pid {self.proc.pid}) "
                                   f"{describe_exit(self.proc.returncode)} before it was ready",
                                   f"try `{self.python} -m {ZYGOTE_MODULE}`")
            if time.monotonic() > deadline:
                raise MachineError(f"the rank interpreter was not ready within "
                                   f"{READY_TIMEOUT_S:g} s", "the machine may be overloaded")
            self.pump(0.1)

    def _reply(self, req_id: int) -> dict[str, Any]:
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while True:
            for i, msg in enumerate(self._replies):
                if msg.get("id") in (req_id, None):
                    return self._replies.pop(i)
            if self._eof or self.proc.poll() is not None:
                raise self._death()
            if time.monotonic() > deadline:
                raise WorkerError(f"the rank interpreter (pid {self.proc.pid}) did not answer "
                                  f"within {REPLY_TIMEOUT_S:g} s")
            self.pump(0.05)
