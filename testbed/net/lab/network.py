"""A built network whose nodes are lab hosts (``testbed.net.backends.remote`` builds it):
``run``, ``popen`` and ``start`` go over SSH, files are put and fetched over SFTP, and a
worker's trace is moved onto the controller's clock as it is fetched (``align_trace``).

Commands run as argument lists quoted into the remote shell; an argv that starts with this
interpreter (``sys.executable``) runs with the host's ``testbed_python`` instead.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePath, PurePosixPath
from typing import IO, Callable, Iterator

from fabric import Connection
from paramiko import SFTPClient

from testbed.errors import writing
from testbed.net.lab import ssh
from testbed.net.lab.inventory import LabHost
from testbed.net.lab.lab import Lab
from testbed.net.lab.process import RemoteProcess
from testbed.net.network import RUN_TIMEOUT_S, Network, Node

TIME_FIELDS = ("t", "t0", "t1")
TRACE_SUFFIX = ".jsonl"   # outputs in the trace format: their times move onto this clock
PROCESSES_PER_CONNECTION = 8


def align_trace(text: str, offset_ns: int, uncertainty_ns: int) -> str:
    """A worker's trace with its monotonic times moved onto the controller's clock (minus the
    host's offset); the meta record notes the offset and its uncertainty."""
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            out.append(line)  # a torn last line stays as it was (readers skip it)
            continue
        for k in TIME_FIELDS:
            if isinstance(rec.get(k), int):
                rec[k] -= offset_ns
        if rec.get("type") == "meta":
            rec.update(clock_offset_ns=offset_ns, clock_offset_uncertainty_ns=uncertainty_ns)
        out.append(json.dumps(rec))
    return "".join(line + "\n" for line in out)


@dataclass
class RemoteNetwork(Network):
    """A Network whose nodes are lab hosts; ``run`` and ``popen`` go over SSH."""

    lab: Lab | None = None
    run_dir: str = ""
    procs: list[RemoteProcess] = field(default_factory=list)
    # connections of their own for long-lived processes, per host: sshd allows
    # MaxSessions (10 by default) channels on one connection, and the lab's own keeps room
    # for commands; each holds at most PROCESSES_PER_CONNECTION running processes
    pool: dict[str, list[tuple[Connection, list[RemoteProcess]]]] = field(default_factory=dict)

    # one SFTP session per connection, which is not safe to use from several threads at once
    # (the shapers read back their directions in threads): one user per host at a time
    sftp_locks: dict[str, threading.Lock] = field(default_factory=dict)

    @contextmanager
    def sftp(self, host: LabHost) -> Iterator[SFTPClient]:
        """The host's SFTP session, held by this thread alone while in the ``with``."""
        lock = self.sftp_locks.setdefault(host.name, threading.Lock())
        with lock:
            yield self.lab.conns[host.name].sftp()

    def process_connection(self, host: LabHost) -> tuple[Connection, list[RemoteProcess]]:
        """A connection to ``host`` with room for one more process (opened when none has)."""
        slots = self.pool.setdefault(host.name, [])
        for conn, running in slots:
            running[:] = [p for p in running if p.returncode is None]
            if len(running) < PROCESSES_PER_CONNECTION:
                return conn, running
        slots.append((ssh.connect(host, self.lab.known_hosts), []))
        return slots[-1]

    def close_connections(self) -> None:
        """Close the processes' own connections (teardown, after the processes)."""
        for slots in self.pool.values():
            for conn, _ in slots:
                conn.close()
        self.pool.clear()

    def lab_host(self, node: Node) -> LabHost:
        return self.lab.host(node.name)

    def _argv(self, host: LabHost, argv: list[str]) -> list[str]:
        return [host.python, *argv[1:]] if argv and argv[0] == sys.executable else list(argv)

    def node_argv(self, node: Node, argv: list[str]) -> list[str]:
        """``argv`` as the node's host runs it for ``node``."""
        return self._argv(self.lab_host(node), argv)

    def argv_in(self, node: Node, argv: list[str]) -> list[str]:
        return ["ssh", self.lab_host(node).name, *self.node_argv(node, argv)]  # messages only

    def run(self, node: Node, argv: list[str], timeout: float = RUN_TIMEOUT_S,
            check: bool = True,
            watch: Callable[[], None] | None = None) -> subprocess.CompletedProcess:
        """Run ``argv`` on the node's host and wait; CommandError on failure when ``check``.
        ``watch`` is called once it returned (nothing of this network runs on this machine)."""
        host = self.lab_host(node)
        r = ssh.run(self.lab.conns[host.name], host, self.node_argv(node, argv), timeout=timeout,
                    check=check)
        if watch is not None:
            watch()
        return subprocess.CompletedProcess(argv, r.returncode, r.stdout, r.stderr)

    def popen(self, node: Node, argv: list[str], stdout=None, stderr=None) -> RemoteProcess:
        """Start ``argv`` on the node's host; its output (stdout and stderr together) goes to
        ``stdout`` when that is a file. Stopped by teardown."""
        host = self.lab_host(node)
        out = stdout if hasattr(stdout, "write") else None
        conn, running = self.process_connection(host)
        proc = RemoteProcess(conn, host, self.node_argv(node, argv), cwd=host.home, output=out)
        running.append(proc)
        self._record(proc)
        return proc

    def gpu_count(self, node: Node) -> int:
        """The GPUs the node's host reported when the lab was opened."""
        return self.lab.gpus.get(node.name, 0)

    def rdma_interface(self, node: Node) -> str | None:
        """The node's interface when its host reported it InfiniBand or RoCE (``Lab.rdma``,
        probed when the lab was opened); None otherwise."""
        return node.iface if self.lab.rdma.get(node.name) else None

    def files_dir(self, node: Node, local_dir: Path) -> PurePath:
        """The run directory on the node's host (one per network, made by ``build``; the
        ranks of one host share it: their files are named by rank)."""
        return PurePosixPath(self.run_dir)

    def put(self, node: Node, local: Path, there: PurePath) -> None:
        """Copy a file to the node's host over SFTP: written beside, under a name of this
        node's, and renamed over ``there``. Several nodes of one machine (``backend:
        cluster``) share its run directory and each copies the cell file into it: a rank
        reading it then sees a whole file, never one that a copy for the next node has just
        truncated."""
        tmp = f"{there}.{node.name}.tmp"
        with self.sftp(self.lab_host(node)) as sftp:
            sftp.put(str(local), tmp)
            sftp.posix_rename(tmp, str(there))

    def write_text(self, node: Node, path: PurePath, text: str) -> None:
        """Replace ``path`` on the node's host with ``text`` (SFTP: written beside, renamed
        over it, so a reader there sees the old file or the new one)."""
        tmp = str(path) + ".tmp"
        with self.sftp(self.lab_host(node)) as sftp:
            with sftp.open(tmp, "w") as f:
                f.write(text.encode())
            sftp.posix_rename(tmp, str(path))

    def read_text(self, node: Node, path: PurePath) -> str | None:
        """``path`` on the node's host; None when it does not exist."""
        try:
            with self.sftp(self.lab_host(node)) as sftp, sftp.open(str(path), "r") as f:
                return f.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return None

    def start(self, node: Node, argv: list[str], env: dict[str, str], log_file: IO[bytes],
              outputs: list[tuple[PurePath, Path]] = (),
              cwd: PurePath | None = None) -> RemoteProcess:
        """Start ``argv`` on the node's host with ``env``, stream its output into ``log_file``;
        when it exits, ``outputs`` are fetched over SFTP (traces moved onto this clock)."""
        host = self.lab_host(node)
        conn, running = self.process_connection(host)
        proc = RemoteProcess(conn, host, self.node_argv(node, argv),
                             cwd=str(cwd) if cwd else host.home, env=env, output=log_file,
                             on_exit=lambda p: self.fetch(host, outputs))
        running.append(proc)
        self._record(proc)
        return proc

    def _record(self, proc: RemoteProcess) -> None:
        """Keep ``proc`` for teardown, and in the ledger for ``clean`` after a SIGKILL. The
        processes seen to have ended (earlier cells' ranks on a reused network) leave both:
        a sweep's ledger holds what runs, not every process it ever started."""
        for p in self.procs:
            if p.returncode is not None:  # its exit and on_exit are done
                p.close()
        self.procs = [p for p in self.procs if p.returncode is None] + [proc]
        if self.ledger.lab and proc.pid is not None:
            live = {(p.host.name, p.pid) for p in self.procs}
            recorded = self.ledger.lab.setdefault("processes", {})
            for host, entries in recorded.items():
                entries[:] = [e for e in entries if (host, e[0]) in live]
            recorded.setdefault(proc.host.name, []).append([proc.pid, proc.start_ticks])
            self.ledger.save()

    def fetch(self, host: LabHost, outputs: list[tuple[PurePath, Path]]) -> None:
        """Copy each (file there, file here) from the host; trace files (JSONL) are aligned to
        the controller's clock with the host's measured offset. Files that were not written
        are skipped."""
        off = self.lab.offsets.get(host.name)
        for there, here in outputs:
            try:
                with self.sftp(host) as sftp, sftp.open(str(there), "r") as f:
                    text = f.read().decode("utf-8", errors="replace")
            except FileNotFoundError:  # a program that writes no trace (not instrumented)
                continue
            if there.suffix == TRACE_SUFFIX:
                text = align_trace(text, off.monotonic_offset_ns if off else 0,
                                   off.uncertainty_ns if off else 0)
            with writing(here):
                Path(here).write_text(text, encoding="utf-8")
