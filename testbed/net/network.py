"""A built network: hosts and routers with addresses, the ends of every inter-DC link, and a way
to run things in them. Backends fill it; shapers, measurements and the runner use it."""
from __future__ import annotations

import glob
import ipaddress
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import IO, Any, Callable

from testbed.errors import CommandError, writing
from testbed.net.ledger import Ledger
from testbed.process import STOP_GRACE_S, ProcessHandle
from testbed.topology import ResolvedLink, Topology

RUN_TIMEOUT_S = 60.0
WATCH_POLL_S = 0.1  # how often a watched command's ``watch`` is called
# NVIDIA's driver makes one character device per GPU (/dev/nvidia0, /dev/nvidia1, …) besides
# /dev/nvidiactl and /dev/nvidia-uvm: the numbered ones count the GPUs a host has, without
# loading CUDA or needing nvidia-smi.
GPU_DEVICES = "/dev/nvidia[0-9]*"


def local_gpu_count(pattern: str = GPU_DEVICES) -> int:
    """GPUs of this machine: the device files matching ``pattern``."""
    return len(glob.glob(pattern))


@dataclass(frozen=True)
class Node:
    """A host or router: the namespace it runs in and its address on its DC's subnet."""

    name: str
    dc: str
    ns: str
    ip: ipaddress.IPv4Address
    iface: str
    index: int = -1  # host index within its DC; -1 for a router


@dataclass(frozen=True)
class LinkEnd:
    """One router's side of an inter-DC link: the interface that sends towards ``peer``."""

    link: ResolvedLink
    router: Node
    iface: str
    peer: str
    peer_ip: ipaddress.IPv4Address


@dataclass
class Network:
    """A built network. Backends fill it; shapers and the runner use it; ``teardown`` ends it."""

    topology: Topology
    links: list[ResolvedLink]
    ledger: Ledger
    hosts: dict[tuple[str, int], Node] = field(default_factory=dict)
    routers: dict[str, Node] = field(default_factory=dict)
    link_ends: list[LinkEnd] = field(default_factory=list)
    backend: Any = None

    @property
    def tag(self) -> str:
        return self.ledger.tag

    def host(self, dc: str, index: int) -> Node:
        return self.hosts[(dc, index)]

    def ends_of(self, link: ResolvedLink) -> tuple[LinkEnd, LinkEnd]:
        """The a-side (sends a→b) and b-side (sends b→a) ends of ``link``."""
        a = next(e for e in self.link_ends if e.link.index == link.index and e.router.dc == link.a)
        b = next(e for e in self.link_ends if e.link.index == link.index and e.router.dc == link.b)
        return a, b

    def argv_in(self, node: Node, argv: list[str]) -> list[str]:
        """``argv`` wrapped to run inside ``node``."""
        return self.backend.argv_in(node, argv)

    def netns_file(self, node: Node) -> str | None:
        """``node``'s network namespace file on this machine; None on a lab host."""
        return self.backend.netns_file(node)

    def run(self, node: Node, argv: list[str], timeout: float = RUN_TIMEOUT_S,
            check: bool = True,
            watch: Callable[[], None] | None = None) -> subprocess.CompletedProcess:
        """Run ``argv`` inside ``node`` and wait; raises CommandError on failure when ``check``.
        ``watch`` is called every WATCH_POLL_S while it runs: what it raises (a part of the
        harness that died, which the command may be waiting on) stops the command and is
        raised."""
        full = self.argv_in(node, argv)
        try:
            res = run_watched(full, timeout, watch)
        except subprocess.TimeoutExpired as e:
            raise CommandError(argv, -1, f"timed out after {timeout:.0f} s", node.name) from e
        if check and res.returncode != 0:
            raise CommandError(argv, res.returncode, (res.stderr or res.stdout)[-2000:], node.name)
        return res

    def popen(self, node: Node, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside ``node``; the process is written into the ledger so that
        teardown and ``clean`` stop it even if this process dies."""
        proc = subprocess.Popen(self.argv_in(node, argv), start_new_session=True, **kwargs)
        self.ledger.add_process(proc.pid)
        return proc

    def gpu_count(self, node: Node) -> int:
        """GPUs the ranks started in ``node`` can use: every namespace of this machine sees
        its GPUs (lab hosts override this with what each host reported)."""
        return local_gpu_count()

    def rdma_interface(self, node: Node) -> str | None:
        """``node``'s interface towards the other DCs (``node.iface``, the one testbed shapes)
        when it carries RDMA (InfiniBand or RoCE, see ``testbed.net.rdma``), whose traffic
        bypasses tc; None otherwise. Namespaces reach each other over veth: None (lab hosts
        override this with what each host reported)."""
        return None

    def files_dir(self, node: Node, local_dir: Path) -> PurePath:
        """Where a process started in ``node`` finds the files of ``local_dir`` (a cell
        directory on this machine): the same directory here; lab hosts override it."""
        return local_dir

    def put(self, node: Node, local: Path, there: PurePath) -> None:
        """Copy ``local`` to ``there`` on ``node`` (nothing to do on this machine)."""

    def write_text(self, node: Node, path: PurePath, text: str) -> None:
        """Replace the file ``path`` where ``node`` sees it (a name from ``files_dir``) with
        ``text``, atomically: a reader sees the old file or the new one."""
        tmp = Path(path).with_suffix(".tmp")
        with writing(Path(path)):
            tmp.write_text(text)
            os.replace(tmp, path)

    def read_text(self, node: Node, path: PurePath) -> str | None:
        """The file ``path`` where ``node`` sees it; None when it does not exist (yet)."""
        try:
            return Path(path).read_text()
        except FileNotFoundError:
            return None

    def start(self, node: Node, argv: list[str], env: dict[str, str], log_file: IO[bytes],
              outputs: list[tuple[PurePath, Path]] = (),
              cwd: PurePath | None = None) -> ProcessHandle:
        """Start ``argv`` inside ``node`` with ``env`` added to the environment, its output
        into ``log_file``, in directory ``cwd`` (default: this process's); ``outputs`` (file
        there, file here) are brought here when it exits, those that exist (nothing to do on
        this machine). Returns its handle, stopped by teardown at the latest."""
        return self.popen(node, argv, env=dict(os.environ, **env), stdout=log_file,
                          stderr=log_file, cwd=cwd)

    def row_notes(self) -> dict[str, Any]:
        """Columns the results row takes from how the network was built (none here; a network
        spread over machines names them and what the links between them add)."""
        return {}

    def teardown(self) -> None:
        """Remove everything this network made; safe to call twice."""
        self.backend.teardown(self)


def run_watched(argv: list[str], timeout: float,
                watch: Callable[[], None] | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True, timeout=timeout)``, calling
    ``watch`` every WATCH_POLL_S; the process is killed (and reaped, within STOP_GRACE_S)
    when ``watch`` raises or the timeout passes."""
    if watch is None:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    deadline = time.monotonic() + timeout
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while True:
            try:
                out, err = proc.communicate(timeout=WATCH_POLL_S)
                return subprocess.CompletedProcess(argv, proc.returncode, out, err)
            except subprocess.TimeoutExpired:
                watch()
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(argv, timeout) from None
    finally:
        if proc.poll() is None:
            proc.kill()
            try:
                proc.communicate(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
