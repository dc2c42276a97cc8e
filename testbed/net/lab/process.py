"""A process started on a lab host over SSH: a ``testbed.process.ProcessHandle`` (``poll``,
``wait``, ``terminate``, ``kill``, ``returncode``, ``pid``) like every other worker's.

The remote command first prints a marked line with its own pid and start time (``sh -c 'echo
"testbed-pid $$ <field 22 of /proc/$$/stat>"; exec "$@"'``; exec keeps both), so terminate and
kill signal exactly that process (``kill -TERM <pid>`` over a second channel), never by name,
and ``clean`` can tell it from a later process given the same pid (``testbed.net.lab.clean``).
Its output (stdout and stderr together) is streamed into a local file while it runs. An
``on_exit`` hook runs once when the exit is first seen, before ``returncode`` is reported (the
backend fetches the worker's trace there, so a watcher reading traces sees them).
"""
from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from typing import IO, Callable

import paramiko
from fabric import Connection

from testbed.errors import CommandError
from testbed.net.lab import ssh
from testbed.net.lab.inventory import LabHost

log = logging.getLogger(__name__)

# The remote shell prints its pid first thing; on a loaded host that can take seconds (starts
# one after another beside a busy test suite). Without it the process could be neither
# signalled nor recorded for ``clean``, so starting it fails after this long.
PID_TIMEOUT_S = 120.0
POLL_S = 0.02
# The exit status reported for a process that succeeded but whose results (its trace) could not
# be fetched: the cell fails instead of losing a rank quietly.
FETCH_FAILED = 70
# $$ is the shell's pid and field 22 of its stat its start time (clock ticks since boot; the
# name in field 2 is "(sh)", without spaces); exec keeps both for the program. The line is
# marked: the login shell sshd runs the command in may print first (a .bashrc's pyenv, racing
# other shells over its shims, wrote "pyenv: cannot rehash: …" before it under load).
PID_MARK = b"testbed-pid "
PID_PREFIX = ["sh", "-c", 'echo "testbed-pid $$ $(cut -d" " -f22 /proc/$$/stat)"; exec "$@"',
              "sh"]


class RemoteProcess:
    """``argv`` running on ``host``; see the module docstring."""

    def __init__(self, conn: Connection, host: LabHost, argv: list[str], *,
                 cwd: str | None = None, env: dict[str, str] | None = None,
                 output: IO[bytes] | None = None,
                 on_exit: Callable[["RemoteProcess"], None] | None = None):
        self.conn, self.host, self.argv = conn, host, list(argv)
        self.returncode: int | None = None
        self.pid: int | None = None
        self.start_ticks: int | None = None  # its start time on the host (/proc/<pid>/stat)
        self._pid_seen = threading.Event()
        self._on_exit, self._output = on_exit, output
        try:
            self._chan = ssh.when_a_channel_opens(conn.client.get_transport().open_session)
        except paramiko.SSHException as e:
            raise CommandError(self.argv, -1, f"cannot open an SSH channel: {e} (sshd's "
                               "MaxSessions caps the channels of one connection)",
                               host.name) from None
        self._chan.set_combine_stderr(True)
        self._chan.exec_command(ssh.command_line(PID_PREFIX + self.argv, cwd=cwd, env=env))
        self._reader = threading.Thread(target=self._pump, daemon=True,
                                        name=f"ssh-out-{host.name}")
        self._reader.start()
        if not self._pid_seen.wait(PID_TIMEOUT_S):
            self._chan.close()
            raise CommandError(self.argv, -1, f"the host's shell reported no pid within "
                               f"{PID_TIMEOUT_S:g} s of starting the process", host.name)

    def _pump(self) -> None:
        """Copy the channel's output into the local file; the marked line is the pid (what the
        login shell printed before it is kept as output)."""
        head = b""
        while True:
            data = self._chan.recv(65536)
            if not data:
                break
            if not self._pid_seen.is_set():
                head += data
                before, mark, rest = head.partition(PID_MARK)
                if not mark or b"\n" not in rest:
                    continue
                line, after = rest.split(b"\n", 1)
                words = line.split()
                if words and all(w.isdigit() for w in words[:2]):
                    self.pid = int(words[0])
                    self.start_ticks = int(words[1]) if len(words) > 1 else None
                data, head = before + after, b""
                self._pid_seen.set()
            if self._output is not None and data:
                try:
                    self._output.write(data)
                    self._output.flush()
                except ValueError:  # its log was closed (the cell is over): drop the rest
                    self._output = None
        if head and not self._pid_seen.is_set() and self._output is not None:
            self._output.write(head)
        self._pid_seen.set()

    def poll(self) -> int | None:
        """The exit status once the remote process has ended (fetching, via on_exit, what it
        left behind first), else None."""
        if self.returncode is None and self._chan.exit_status_ready():
            code = self._chan.recv_exit_status()
            self._reader.join(timeout=5)
            if self._on_exit is not None:
                try:
                    self._on_exit(self)
                except Exception as e:  # noqa: BLE001 - any failure here loses results
                    code = self._exit_failed(code, e)
            self.returncode = code
            self._chan.close()  # the connection's channel is free for the next process
        return self.returncode

    def _exit_failed(self, code: int, e: Exception) -> int:
        """What fetching the process's results (the trace) raised is an error: written into
        its output (where the watcher reads a rank's last lines) and, when the process itself
        succeeded, turned into exit status FETCH_FAILED."""
        msg = f"testbed: fetching what the process left on {self.host.name} failed: {e}"
        log.error(msg)
        if self._output is not None:
            self._output.write(f"\n{msg}\n".encode())
            self._output.flush()
        return code if code != 0 else FETCH_FAILED

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.argv, timeout)
            time.sleep(POLL_S)
        return self.returncode

    def _signal(self, sig: str) -> None:
        if self.pid is None:
            self._chan.close()
            return
        try:
            ssh.run(self.conn, self.host, ["kill", f"-{sig}", str(self.pid)], check=False,
                    timeout=10)
        except CommandError as e:
            log.warning("kill -%s %s on %s: %s", sig, self.pid, self.host.name, e)

    def terminate(self) -> None:
        if self.poll() is None:
            self._signal("TERM")

    def send_signal(self, sig: int) -> None:
        """Signal the remote process (by its pid) while it runs, as ``Popen.send_signal``."""
        if self.poll() is None:
            self._signal(signal.Signals(sig).name.removeprefix("SIG"))

    def kill(self) -> None:
        if self.poll() is None:
            self._signal("KILL")
        if self.poll() is None:
            self._chan.close()

    def close_stdin(self) -> None:
        """End the remote process's standard input (it reads end of file)."""
        self._chan.shutdown_write()

    def close(self) -> None:
        self._chan.close()
