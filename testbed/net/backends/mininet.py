"""The ``mininet`` backend: a topology built from Mininet's own nodes, links and switches.

Layout (differs from ``netns`` where Mininet's model requires it):

- Per DC (i = 1-based index), a Mininet ``LinuxBridge`` switch ``<tag>s<i>`` in the **root**
  namespace. Its ports are the root-side ends of veth pairs: ``<tag>s<i>h<j>`` towards host j and
  ``<tag>s<i>r`` towards the router. These are the only objects made in the root namespace; each
  is written into ``ledger.root_links`` before it exists.
- Per DC, a router: a Mininet ``Host`` (shell ``mininet:<tag>-<dc>`` in its own network and mount
  namespace) with ``eth0`` on the switch carrying the router's address, one ``to-<peer>`` veth
  per inter-DC link (both ends inside router namespaces) and ``net.ipv4.ip_forward=1``.
- Per host, a Mininet ``Host`` (shell ``mininet:<tag>-<dc>-<j>``) with ``eth0`` on the switch and
  a route to every other DC's subnet via the router (no default route:
  ``Topology.other_subnets``).

Unlike ``netns``, the DC side of host j's link is the switch port ``<tag>s<i>h<j>`` in the root
namespace, not a port ``h<j>`` inside the router: use :meth:`MininetBackend.host_port` to reach it.

Mininet's hosts are unnamed namespaces held by their shell process, so ``Node.ns`` holds that
shell's pid (as a string) and :meth:`MininetBackend.argv_in` wraps argv in ``mnexec -a <pid>``:
mnexec attaches to the pid's network and mount namespaces (the mount namespace has a ``/sys``
that shows the node's own interfaces), keeps the caller's working directory, and then execs argv,
so a ``Popen`` of the result has the pid of the command itself.

Only Mininet's node, link and switch classes are used, not its ``Mininet`` container: creating a
``Mininet`` object runs ``fixLimits()``, which overwrites the root namespace's
``net.ipv4.tcp_rmem``/``tcp_wmem`` and raises other machine-wide limits. ``mn -c`` is never run.
"""
from __future__ import annotations

import ipaddress
import shutil
import subprocess
from pathlib import Path

from mininet.link import Link
from mininet.node import Host
from mininet.nodelib import LinuxBridge

from testbed.errors import MachineError, NetworkError
from testbed.net import ledger as ledgers
from testbed.net.backends.local import LocalBackend
from testbed.net.backends.mininetnodes import (PORTS_GONE_S, Parts, RecordedBridge,
                                               RecordedHost, await_ports_gone, shell_run)
from testbed.net.ledger import Ledger
from testbed.net.network import LinkEnd, Network, Node
from testbed.net.tcp import (allow_congestion_control, host_sysctls,
                             make_room_for_neighbours)
from testbed.topology import IFNAMSIZ, ResolvedLink, Topology

HOST_IFACE = "eth0"
ROUTER_IFACE = "eth0"
# Mininet runs ifconfig and brctl itself (its own setup() would exit(1) without them).
REQUIRED_TOOLS = ("mnexec", "ifconfig", "brctl", "ip", "sysctl")
SHELL_MARK = b"mininet:tb"  # argv of every shell this backend starts: "... -is mininet:<tag>-…"


def switch_name(tag: str, i: int) -> str:
    """The bridge of DC number ``i`` (1-based) in the root namespace."""
    return f"{tag}s{i}"


def switch_port(tag: str, i: int, j: int) -> str:
    """The root-side port of host j's link on DC i's bridge (LinuxBridge only enslaves ports
    whose names contain the bridge's name)."""
    return f"{switch_name(tag, i)}h{j}"


def router_port(tag: str, i: int) -> str:
    return f"{switch_name(tag, i)}r"


def link_iface(peer: str) -> str:
    """The interface in a router that sends towards DC ``peer`` (as in ``netns``)."""
    return f"to-{peer}"


def check_machine() -> None:
    """Raise MachineError if a tool Mininet or this backend runs is missing."""
    missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
    if missing:
        raise MachineError(f"backend mininet needs {', '.join(missing)}",
                           "apt-get install mininet bridge-utils net-tools iproute2 procps")


def check_bridge_firewall() -> None:
    """Raise MachineError if bridged packets would be dropped: with br_netfilter's
    ``bridge-nf-call-iptables`` on, frames crossing a root-namespace bridge go through the root
    namespace's iptables FORWARD chain (a Docker host sets its policy to DROP)."""
    flag = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
    if not flag.exists() or flag.read_text().strip() != "1":
        return
    rules = subprocess.run(["iptables", "-w", "-S", "FORWARD"], capture_output=True, text=True)
    if "-P FORWARD DROP" in rules.stdout:
        raise MachineError(
            "backend mininet: bridged traffic would be dropped (net.bridge.bridge-nf-call-iptables"
            "=1 and the root namespace's iptables FORWARD policy is DROP)",
            "set net.bridge.bridge-nf-call-iptables=0, or accept traffic on the run's bridges, "
            "or use backend netns (its bridges are inside namespaces)")


def check_names(topology: Topology, tag: str) -> None:
    """Raise NetworkError if a root-namespace interface name would exceed 15 characters."""
    n, most = len(topology.dcs), max(dc.hosts for dc in topology.dcs) - 1
    longest = max((switch_port(tag, n, most), router_port(tag, n)), key=len)
    if len(longest) > IFNAMSIZ:
        raise NetworkError(f"interface name {longest} is longer than {IFNAMSIZ} characters; "
                           "use fewer DCs or hosts per DC with the mininet backend")


class MininetBackend(LocalBackend):
    """Builds Mininet networks and removes them. Keeps each network's Mininet objects (the
    shells it talks to) until its teardown; the kernel objects are also in the ledger."""

    name = "mininet"

    def __init__(self) -> None:
        self._parts: dict[str, Parts] = {}

    def argv_in(self, node: Node, argv: list[str]) -> list[str]:
        """``argv`` wrapped as ``mnexec -a <shell pid> argv``. Raises NetworkError if the node's
        Mininet shell is gone (its pid could since belong to a process in the root namespace)."""
        try:
            cmdline = Path(f"/proc/{int(node.ns)}/cmdline").read_bytes()
        except (OSError, ValueError):
            cmdline = b""
        if SHELL_MARK not in cmdline:
            raise NetworkError(f"node {node.name}: its Mininet shell (pid {node.ns}) is gone; "
                               "was the network torn down?")
        return ["mnexec", "-a", node.ns, *argv]

    def netns_file(self, node: Node) -> str | None:
        """The network namespace of the node's shell (``node.ns`` is its pid); raises
        NetworkError when that shell is gone."""
        self.argv_in(node, [])
        return f"/proc/{node.ns}/ns/net"

    def host_port(self, net: Network, dc: str, j: int) -> tuple[Node, str]:
        """The DC side of host j's link: (the switch's node in the root namespace, its port).
        ``netns`` has this as ``(net.routers[dc], f"h{j}")``; shape intra-DC rate here."""
        parts = self._parts.get(net.tag)
        if parts is None:
            raise NetworkError(f"network {net.tag} is not up")
        return parts.switch_nodes[dc], switch_port(net.tag, net.topology.dc_index(dc) + 1, j)

    def build(self, topology: Topology, links: list[ResolvedLink], ledger: Ledger) -> Network:
        """Create switches, routers, hosts, links, addresses and routes through Mininet.
        Raises MachineError if tools are missing or bridged traffic would be dropped; on any
        other failure removes what was made and raises NetworkError."""
        check_machine()
        check_bridge_firewall()
        check_names(topology, ledger.tag)
        allow_congestion_control(topology.tcp_congestion_control)
        make_room_for_neighbours(topology)
        net = Network(topology=topology, links=links, ledger=ledger, backend=self)
        ledger.backend = self.name
        ledger.save()
        self._parts[ledger.tag] = parts = Parts()
        try:
            for i, dc in enumerate(topology.dcs, start=1):
                self._dc(net, parts, i, dc.name)
            for link in links:
                self._link(net, parts, link)
            self._routes(net, parts)
        except BaseException as e:
            self.teardown(net)
            # Mininet raises bare Exception (e.g. when a veth cannot be made)
            if isinstance(e, Exception) and not isinstance(e, NetworkError):
                raise NetworkError(f"building the {topology.name} network with Mininet "
                                   f"failed: {e}") from e
            raise
        return net

    def teardown(self, net: Network) -> None:
        """End every Mininet shell and every process the ledger lists; the kernel then removes
        each node's namespace with its veths (the switch ports go with them); finally delete
        the bridges and the ledger. Idempotent.

        Mininet's own ``stop`` deletes each link with ``ip link del`` first: about 25 ms per
        veth here (1.8 s for 4 × 16 hosts), against about 40 ms in all for the kernel's batch
        removal awaited below."""
        parts = self._parts.pop(net.tag, None)
        try:
            if parts is not None:
                parts.terminate()
                ledgers.stop_pids([pid for pid, start in net.ledger.processes
                                   if ledgers.proc_start_time(pid) == start])
                bridges = {switch_name(net.tag, i + 1) for i in range(len(net.topology.dcs))}
                await_ports_gone(net.ledger, bridges, PORTS_GONE_S)
        finally:
            ledgers.destroy(net.ledger)

    # ---- build steps ----

    @staticmethod
    def _root_link(net: Network, name: str) -> str:
        """Write a root-namespace interface into the ledger before it is created."""
        net.ledger.root_links.append(name)
        net.ledger.save()
        return name

    def _dc(self, net: Network, parts: Parts, i: int, dc: str) -> None:
        sw = RecordedBridge(self._root_link(net, switch_name(net.tag, i)), f"{i:x}", net.ledger)
        parts.switches.append(sw)
        parts.switch_nodes[dc] = Node(name=f"{dc}-switch", dc=dc, ns=str(sw.pid),
                                      ip=net.topology.subnet(dc).network_address, iface=sw.name)
        self._router(net, parts, sw, i, dc)
        for j in range(net.topology.dc(dc).hosts):
            self._host(net, parts, sw, i, dc, j)
        sw.start([])  # creates the bridge and enslaves every port made above

    def _node(self, net: Network, parts: Parts, name: str) -> Host:
        host = RecordedHost(name, net.ledger)
        parts.nodes.append(host)
        shell_run(host, ["ip", "link", "set", "lo", "up"])
        return host

    def _attach(self, net: Network, node: Host, sw: LinuxBridge, port: str, iface: str,
                ip: ipaddress.IPv4Address, prefixlen: int) -> None:
        """A veth from ``node``'s ``iface`` (created inside its namespace) to bridge port
        ``port`` (created in the root namespace), with the address on ``iface``."""
        Link(node, sw, intfName1=iface, intfName2=self._root_link(net, port))
        shell_run(node, ["ip", "addr", "add", f"{ip}/{prefixlen}", "dev", iface])

    def _router(self, net: Network, parts: Parts, sw: LinuxBridge, i: int, dc: str) -> None:
        topo = net.topology
        r = self._node(net, parts, f"{net.tag}-{dc}")
        shell_run(r, ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
        self._attach(net, r, sw, router_port(net.tag, i), ROUTER_IFACE,
                     topo.router_ip(dc), topo.subnet(dc).prefixlen)
        net.routers[dc] = Node(name=f"{dc}-router", dc=dc, ns=str(r.pid), ip=topo.router_ip(dc),
                               iface=ROUTER_IFACE)
        parts.routers[dc] = r

    def _host(self, net: Network, parts: Parts, sw: LinuxBridge, i: int, dc: str,
              j: int) -> None:
        topo = net.topology
        h = self._node(net, parts, f"{net.tag}-{dc}-{j}")
        self._attach(net, h, sw, switch_port(net.tag, i, j), HOST_IFACE,
                     topo.host_ip(dc, j), topo.subnet(dc).prefixlen)
        for subnet in topo.other_subnets(dc):  # no default route (Topology.other_subnets)
            shell_run(h, ["ip", "route", "add", str(subnet), "via", str(topo.router_ip(dc))])
        shell_run(h, ["sysctl", "-q", "-w", *(f"{k}={v}" for k, v in host_sysctls(topo).items())])
        net.hosts[(dc, j)] = Node(name=f"{dc}-{j}", dc=dc, ns=str(h.pid), ip=topo.host_ip(dc, j),
                                  iface=HOST_IFACE, index=j)

    def _link(self, net: Network, parts: Parts, link: ResolvedLink) -> None:
        """Router ↔ router veth ``to-<b>``/``to-<a>``: both ends live in router namespaces."""
        ra, rb = parts.routers[link.a], parts.routers[link.b]
        ip_a, ip_b = list(link.transit.hosts())[:2]
        ia, ib = link_iface(link.b), link_iface(link.a)
        Link(ra, rb, intfName1=ia, intfName2=ib)
        shell_run(ra, ["ip", "addr", "add", f"{ip_a}/{link.transit.prefixlen}", "dev", ia])
        shell_run(rb, ["ip", "addr", "add", f"{ip_b}/{link.transit.prefixlen}", "dev", ib])
        net.link_ends.append(LinkEnd(link, net.routers[link.a], ia, link.b, ip_b))
        net.link_ends.append(LinkEnd(link, net.routers[link.b], ib, link.a, ip_a))

    def _routes(self, net: Network, parts: Parts) -> None:
        for dc, targets in net.topology.routes(net.links).items():
            router = parts.routers[dc]
            for dst, hop in targets.items():
                end = next(e for e in net.link_ends if e.router.dc == dc and e.peer == hop)
                shell_run(router, ["ip", "route", "add", str(net.topology.subnet(dst)),
                              "via", str(end.peer_ip)])
