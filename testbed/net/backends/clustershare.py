"""One machine's share of a ``backend: cluster`` emulation, built on that machine.

The controller sends each machine a ``Share``: the whole topology and its links, which machine
carries which DC, and every machine's underlay (the address and NIC the machines reach each
other on). The machine builds the routers and hosts of its own DCs exactly as the ``netns``
backend does on one box (``ShareBuilder`` is a ``NetnsBackend``), links between two of its own
DCs as veths, and its end of a link whose other DC is on another machine as a VXLAN interface:
made in the machine's own namespace (where the underlay is, so its UDP socket stays there),
moved into the DC's router namespace and named ``to-<peer>`` like a veth end. The shapers
then treat it as any other link end: impairments apply on the emulated side of the tunnel.

MTU: the tunnel adds 50 bytes (outer Ethernet 14, IPv4 20, UDP 8, VXLAN 8). The VXLAN interface
gets 1500 where the underlay's MTU is 1550 or more, so 1500-byte frames and 64 KB GSO packets
(segmented by the tunnel device) both pass as on a veth; on a 1500-byte underlay it gets the
underlay's MTU less 50, and the share's record says so (``tunnel_mtu``).
"""
from __future__ import annotations

import ipaddress
import logging

from pydantic import BaseModel
from pyroute2 import IPRoute, NetNS

from testbed.errors import NetworkError
from testbed.net.backends.netns import (NetnsBackend, _index, link_iface, router_ns)
from testbed.net.ledger import Ledger
from testbed.net.network import LinkEnd, Network
from testbed.topology import ResolvedLink, Topology

log = logging.getLogger(__name__)

VXLAN_PORT = 4789            # IANA's; every tunnel of a machine shares it, told apart by VNI
VXLAN_OVERHEAD = 50          # outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8
FRAME_MTU = 1500
VNI_SPACE = 1 << 24


class Underlay(BaseModel):
    """How the other machines reach one machine: its address and the NIC carrying it."""

    addr: ipaddress.IPv4Address
    iface: str


class Share(BaseModel):
    """What one machine builds (see the module docstring)."""

    machine: str
    tag: str                     # this machine's run tag: its namespaces are ``<tag>-…``
    vni_base: int                # the whole network's: both ends of a tunnel agree on its VNI
    topology: Topology
    links: list[ResolvedLink]
    placed: dict[str, str]       # DC → machine
    underlay: dict[str, Underlay]

    def mine(self) -> set[str]:
        return {dc for dc, m in self.placed.items() if m == self.machine}


def vni(vni_base: int, link: ResolvedLink) -> int:
    """The VXLAN network identifier of one link (1 … 2^24 − 1)."""
    return 1 + (vni_base + link.index) % (VNI_SPACE - 1)


def tunnel_mtu(underlay_mtu: int) -> int:
    """The emulated link's MTU over an underlay of ``underlay_mtu`` (see the module docstring)."""
    return min(FRAME_MTU, underlay_mtu - VXLAN_OVERHEAD)


class ShareBuilder(NetnsBackend):
    """Builds one machine's share with the netns backend's own steps, plus tunnel ends."""

    name = "cluster-share"

    def __init__(self, share: Share):
        self.share = share
        self.tunnel_mtus: dict[str, int] = {}

    def build_share(self, ledger: Ledger) -> Network:
        """Make this machine's routers, hosts, links and tunnel ends; on failure remove what
        was made and raise NetworkError."""
        sh = self.share
        return self.build_dcs(sh.topology, sh.links, ledger, sh.mine())

    def _outward_link(self, net: Network, link: ResolvedLink) -> None:
        self._tunnel_end(net, link)

    def _tunnel_end(self, net: Network, link: ResolvedLink) -> None:
        sh = self.share
        here = link.a if sh.placed[link.a] == sh.machine else link.b
        peer = link.b if here == link.a else link.a
        ip_a, ip_b = list(link.transit.hosts())[:2]
        mine_ip, peer_ip = (ip_a, ip_b) if here == link.a else (ip_b, ip_a)
        local, remote = sh.underlay[sh.machine], sh.underlay[sh.placed[peer]]
        temp = f"{sh.tag}x{link.index}"  # its name until it is in the router namespace
        net.ledger.root_links.append(temp)
        net.ledger.save()
        with IPRoute() as ip:
            found = ip.link_lookup(ifname=local.iface)
            if not found:
                raise NetworkError(f"{sh.machine} has no underlay interface {local.iface}")
            under_mtu = ip.get_links(found[0])[0].get_attr("IFLA_MTU")
            mtu = tunnel_mtu(under_mtu)
            ip.link("add", ifname=temp, kind="vxlan", vxlan_id=vni(sh.vni_base, link),
                    vxlan_local=str(local.addr), vxlan_group=str(remote.addr),
                    vxlan_port=VXLAN_PORT, vxlan_link=found[0])
            idx = _index(ip, temp)
            ip.link("set", index=idx, mtu=mtu)
            ip.link("set", index=idx, net_ns_fd=router_ns(net.tag, here))
        iface = link_iface(peer)
        ns = NetNS(router_ns(net.tag, here))
        try:
            ns.link("set", index=_index(ns, temp), ifname=iface)
            self._addr_up(ns, iface, mine_ip, link.transit.prefixlen)
        finally:
            ns.close()
        self.tunnel_mtus[link.name] = mtu
        log.info("link %s: VXLAN %d to %s (%s), MTU %d over underlay MTU %d", link.name,
                 vni(sh.vni_base, link), sh.placed[peer], remote.addr, mtu, under_mtu)
        net.link_ends.append(LinkEnd(link, net.routers[here], iface, peer, peer_ip))
