"""The ``netns`` backend: a topology as Linux network namespaces, built over netlink (pyroute2).

Per DC, a router namespace ``<tag>-<dc>`` holds a bridge ``br0`` carrying the router's address,
one port ``h<j>`` per host and one interface ``to-<peer>`` per inter-DC link. Each host is a
namespace ``<tag>-<dc>-<j>`` with ``eth0`` on that bridge and a route to every other DC's subnet
via the router (no default route: ``Topology.other_subnets``).
Routers forward and route every other DC's subnet along the lowest-delay path.

Nothing is created in the root namespace, so deleting the tagged namespaces (done in reverse
order by ``teardown`` and by ``clean`` after a crash) removes every interface, qdisc and rule.
"""
from __future__ import annotations

import ipaddress
import logging
from contextlib import contextmanager
from typing import Iterator

from pyroute2 import NetNS, netns
from pyroute2.netlink.exceptions import NetlinkError

from testbed.errors import NetworkError
from testbed.net import ledger as ledgers
from testbed.net.network import LinkEnd, Network, Node
from testbed.net.backends.local import LocalBackend
from testbed.net.ledger import Ledger
from testbed.net.tcp import (allow_congestion_control, host_sysctls,
                             make_room_for_neighbours)
from testbed.topology import ResolvedLink, Topology

log = logging.getLogger(__name__)

BRIDGE = "br0"
HOST_IFACE = "eth0"


def router_ns(tag: str, dc: str) -> str:
    return f"{tag}-{dc}"


def host_ns(tag: str, dc: str, j: int) -> str:
    return f"{tag}-{dc}-{j}"


def link_iface(peer: str) -> str:
    """The interface in a router that sends towards DC ``peer`` (≤ 9 characters)."""
    return f"to-{peer}"


def _index(ns: NetNS, ifname: str) -> int:
    found = ns.link_lookup(ifname=ifname)
    if not found:
        raise NetworkError(f"interface {ifname} vanished while building")
    return found[0]


@contextmanager
def _inside(name: str) -> Iterator[None]:
    """Run the body with this thread in namespace ``name`` (for /proc/sys writes)."""
    netns.pushns(name)
    try:
        yield
    finally:
        netns.popns()


def _sysctl(name: str, values: dict[str, str]) -> None:
    with _inside(name):
        for key, value in values.items():
            with open("/proc/sys/" + key.replace(".", "/"), "w") as f:
                f.write(value)


class NetnsBackend(LocalBackend):
    """Builds and removes namespace networks. Stateless: everything lives in the Network."""

    name = "netns"

    def argv_in(self, node: Node, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", node.ns, *argv]

    def netns_file(self, node: Node) -> str | None:
        return f"/run/netns/{node.ns}"

    def build(self, topology: Topology, links: list[ResolvedLink], ledger: Ledger) -> Network:
        """Create every namespace, bridge, veth, address and route; on any failure, remove
        what was made and raise NetworkError."""
        return self.build_dcs(topology, links, ledger, {dc.name for dc in topology.dcs})

    def build_dcs(self, topology: Topology, links: list[ResolvedLink], ledger: Ledger,
                  dcs: set[str]) -> Network:
        """``build`` of the DCs named ``dcs`` only (one machine's share of a network spread
        over several): a link with one end among them is made by ``_outward_link``."""
        allow_congestion_control(topology.tcp_congestion_control)
        make_room_for_neighbours(topology)
        net = Network(topology=topology, links=links, ledger=ledger, backend=self)
        ledger.backend = self.name
        ledger.save()
        try:
            for dc in topology.dcs:
                if dc.name in dcs:
                    self._router(net, dc.name)
                    for j in range(dc.hosts):
                        self._host(net, dc.name, j)
            for link in links:
                if link.a in dcs and link.b in dcs:
                    self._link(net, link)
                elif link.a in dcs or link.b in dcs:
                    self._outward_link(net, link)
            self._routes(net)
        except (NetlinkError, OSError) as e:
            self.teardown(net)
            raise NetworkError(f"building the {topology.name} network failed: {e}") from e
        except BaseException:
            self.teardown(net)
            raise
        return net

    def _outward_link(self, net: Network, link: ResolvedLink) -> None:
        """The end here of a link whose other DC is built elsewhere (none on one box)."""
        raise NetworkError(f"link {link.name}: DC {link.b} or {link.a} is not built here")

    def teardown(self, net: Network) -> None:
        ledgers.destroy(net.ledger)

    def host_port(self, net: Network, dc: str, j: int) -> tuple[Node, str]:
        """The DC side of host j's link: the router's bridge port ``h<j>``."""
        return net.routers[dc], f"h{j}"

    def _new_ns(self, net: Network, name: str) -> NetNS:
        net.ledger.add_namespace(name)  # written down before it exists: clean can find it
        netns.create(name)
        ns = NetNS(name)
        ns.link("set", index=_index(ns, "lo"), state="up")
        return ns

    def _router(self, net: Network, dc: str) -> None:
        topo, name = net.topology, router_ns(net.tag, dc)
        ns = self._new_ns(net, name)
        try:
            ns.link("add", ifname=BRIDGE, kind="bridge")
            br = _index(ns, BRIDGE)
            ns.addr("add", index=br, address=str(topo.router_ip(dc)),
                    prefixlen=topo.subnet(dc).prefixlen)
            ns.link("set", index=br, state="up")
        finally:
            ns.close()
        _sysctl(name, {"net.ipv4.ip_forward": "1"})
        net.routers[dc] = Node(name=f"{dc}-router", dc=dc, ns=name, ip=topo.router_ip(dc),
                               iface=BRIDGE)

    def _host(self, net: Network, dc: str, j: int) -> None:
        topo, name, router = net.topology, host_ns(net.tag, dc, j), router_ns(net.tag, dc)
        port = f"h{j}"
        ns = self._new_ns(net, name)
        try:
            ns.link("add", ifname=HOST_IFACE, kind="veth",
                    peer={"ifname": port, "net_ns_fd": router})
            idx = _index(ns, HOST_IFACE)
            ns.addr("add", index=idx, address=str(topo.host_ip(dc, j)),
                    prefixlen=topo.subnet(dc).prefixlen)
            ns.link("set", index=idx, state="up")
            for subnet in topo.other_subnets(dc):
                ns.route("add", dst=str(subnet), gateway=str(topo.router_ip(dc)))
        finally:
            ns.close()
        rns = NetNS(router)
        try:
            rns.link("set", index=_index(rns, port), master=_index(rns, BRIDGE), state="up")
        finally:
            rns.close()
        _sysctl(name, host_sysctls(topo))
        net.hosts[(dc, j)] = Node(name=f"{dc}-{j}", dc=dc, ns=name, ip=topo.host_ip(dc, j),
                                  iface=HOST_IFACE, index=j)

    def _link(self, net: Network, link: ResolvedLink) -> None:
        ra, rb = router_ns(net.tag, link.a), router_ns(net.tag, link.b)
        ip_a, ip_b = list(link.transit.hosts())[:2]
        ia, ib = link_iface(link.b), link_iface(link.a)
        ns = NetNS(ra)
        try:
            ns.link("add", ifname=ia, kind="veth", peer={"ifname": ib, "net_ns_fd": rb})
            self._addr_up(ns, ia, ip_a, link.transit.prefixlen)
        finally:
            ns.close()
        ns = NetNS(rb)
        try:
            self._addr_up(ns, ib, ip_b, link.transit.prefixlen)
        finally:
            ns.close()
        net.link_ends.append(LinkEnd(link, net.routers[link.a], ia, link.b, ip_b))
        net.link_ends.append(LinkEnd(link, net.routers[link.b], ib, link.a, ip_a))

    @staticmethod
    def _addr_up(ns: NetNS, ifname: str, ip: ipaddress.IPv4Address, prefixlen: int) -> None:
        idx = _index(ns, ifname)
        ns.addr("add", index=idx, address=str(ip), prefixlen=prefixlen)
        ns.link("set", index=idx, state="up")

    def _routes(self, net: Network) -> None:
        hops = net.topology.routes(net.links)
        for dc, targets in hops.items():
            if dc not in net.routers:  # another machine's DC (backend cluster)
                continue
            ns = NetNS(router_ns(net.tag, dc))
            try:
                for dst, hop in targets.items():
                    end = next(e for e in net.link_ends if e.router.dc == dc and e.peer == hop)
                    ns.route("add", dst=str(net.topology.subnet(dst)), gateway=str(end.peer_ip))
            finally:
                ns.close()
