"""A built ``backend: cluster`` network: namespaces on several machines.

Whatever reaches the machines (SSH, or ``srun`` inside a Slurm allocation), the network holds
the same record of how it is spread (``Spread``: which machine carries which DC and node, the
machines' agents, the tunnels' MTUs, the underlay measured between machines) and says the same
in the results row. ``ClusterNetwork`` is the SSH one: a lab network (``RemoteNetwork``:
commands, files and processes over SSH, traces fetched and moved onto the controller's clock)
whose nodes are namespaces, so a node's commands run on its machine inside its namespace
(``ip netns exec``).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from testbed.net.lab.inventory import LabHost
from testbed.net.lab.network import RemoteNetwork
from testbed.net.network import Node
from testbed.process import ProcessHandle


class AgentOutput:
    """A machine agent's output, kept in memory (it is a few lines) and searchable."""

    def __init__(self) -> None:
        self._data, self._lock = b"", threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            self._data += data

    def flush(self) -> None:
        pass

    def text(self) -> str:
        with self._lock:
            return self._data.decode(errors="replace")


@dataclass
class Agent:
    """One machine's agent (``testbed.net.backends.clusteragent``): its process, its output,
    how to end its input (it then removes its share) and how to let go of its channel."""

    proc: ProcessHandle
    output: AgentOutput
    end_input: Callable[[], None]
    close: Callable[[], None] = lambda: None


@dataclass
class Spread:
    """How a network is spread over machines, and what joins them."""

    placed: dict[str, str] = field(default_factory=dict)        # DC → machine
    machine_of: dict[str, str] = field(default_factory=dict)    # node namespace → machine
    agents: dict[str, Agent] = field(default_factory=dict)
    tunnel_mtu: dict[str, int] = field(default_factory=dict)    # link name → MTU
    underlay: dict[str, dict[str, float | None]] = field(default_factory=dict)

    def machine(self, node: Node) -> str:
        """The machine that carries ``node`` (a machine node is its own)."""
        return self.machine_of.get(node.ns) or node.name

    def notes(self) -> dict[str, Any]:
        """The row's columns: which DCs each machine carried, the underlay's own round trip
        and rate between machines a tunnel joins (the worst pair), the tunnels' MTU (the
        smallest)."""
        rtts = [u["rtt_ms"] for u in self.underlay.values() if u.get("rtt_ms") is not None]
        rates = [u["rate_mbit"] for u in self.underlay.values()
                 if u.get("rate_mbit") is not None]
        machines: dict[str, list[str]] = {}
        for dc, m in self.placed.items():
            machines.setdefault(m, []).append(dc)
        return {"cluster_machines": " ".join(f"{m}:{'+'.join(d)}" for m, d in machines.items()),
                "underlay_rtt_ms": max(rtts) if rtts else None,
                "underlay_rate_mbit": min(rates) if rates else None,
                "tunnel_mtu": min(self.tunnel_mtu.values()) if self.tunnel_mtu else None}


def machine_node(name: str, ip, iface: str) -> Node:
    """A machine itself as a node (its own namespace, its underlay address): what the underlay
    is measured between."""
    return Node(name, "", "", ip, iface)


@dataclass
class ClusterNetwork(RemoteNetwork):
    """Nodes are namespaces on the machines of ``lab`` (its hosts are the machines)."""

    spread: Spread = field(default_factory=Spread)

    def lab_host(self, node: Node) -> LabHost:
        return self.lab.host(self.spread.machine(node))

    def machine_node(self, machine: str) -> Node:
        h = self.lab.host(machine)
        return machine_node(machine, h.ip, h.iface)

    def node_argv(self, node: Node, argv: list[str]) -> list[str]:
        """``argv`` on the node's machine, inside the node's namespace (a machine node: in
        the machine's own)."""
        inner = self._argv(self.lab_host(node), argv)
        return ["ip", "netns", "exec", node.ns, *inner] if node.ns else inner

    def gpu_count(self, node: Node) -> int:
        """The GPUs of the node's machine (every namespace there sees them)."""
        return self.lab.gpus.get(self.spread.machine(node), 0)

    def rdma_interface(self, node: Node) -> str | None:
        """None: the node's links are veths and tunnels, which carry no RDMA."""
        return None

    def row_notes(self) -> dict[str, Any]:
        return self.spread.notes()
