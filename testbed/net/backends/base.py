"""What every backend builds: hosts and routers with addresses, and a way to run things in them."""
from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from testbed.errors import CommandError
from testbed.net.ledger import Ledger
from testbed.net.topology import ResolvedLink, Topology

RUN_TIMEOUT_S = 60.0


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

    def run(self, node: Node, argv: list[str], timeout: float = RUN_TIMEOUT_S,
            check: bool = True) -> subprocess.CompletedProcess:
        """Run ``argv`` inside ``node`` and wait; raises CommandError on failure when ``check``."""
        full = self.argv_in(node, argv)
        try:
            res = subprocess.run(full, capture_output=True, text=True, timeout=timeout)
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

    def start_worker(self, node: Node, rank: int, env: dict[str, str], cell_dir: Path,
                     log_file) -> Any:
        """Start rank ``rank``'s worker inside ``node`` with the torchrun-style ``env``, its
        output into ``log_file`` and its trace into ``cell_dir``; returns a Popen-like handle
        (``poll``, ``terminate``, ``kill``, ``wait``). Remote networks override this."""
        argv = [sys.executable, "-m", "testbed.train.worker",
                "--cell", str(cell_dir / "cell.json"), "--out", str(cell_dir)]
        return self.popen(node, argv, env=dict(os.environ, **env, GLOO_SOCKET_IFNAME=node.iface),
                          stdout=log_file, stderr=log_file)

    def teardown(self) -> None:
        """Remove everything this network made; safe to call twice."""
        self.backend.teardown(self)


class Backend(Protocol):
    """Builds a Network from a Topology; runs argv in its nodes; tears it down."""

    name: str

    def build(self, topology: Topology, links: list[ResolvedLink], ledger: Ledger) -> Network: ...

    def argv_in(self, node: Node, argv: list[str]) -> list[str]: ...

    def teardown(self, net: Network) -> None: ...

    def host_port(self, net: Network, dc: str, j: int) -> tuple[Node, str]:
        """The node and interface on the DC side of host j's link (for intra-DC shaping)."""
        ...
