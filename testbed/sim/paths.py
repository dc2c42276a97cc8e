"""Paths between hosts of one cell's emulated network, as the simulator and the planner see it.

A path follows the network as built: a rank's host link to its DC (the DC's ``intra`` profile,
``links.intra_dc`` already laid over it), then the inter-DC links along ``Topology.routes``
(each direction its own profile), then the receiving host's link. A path with delay is also
capped at what ``connections`` TCP windows move per round trip (``tcp_buffer_max_mb`` ×
``TCP_WINDOW_PER_BUFFER`` each); the cap is applied as the rate of the path's FIFO, so
concurrent transfers on one direction share it.

Two ranks on one host (``workload.ranks_per_host`` > 1) talk through that host's own network
stack: their path is ``SAME_HOST``, with no host link, no inter-DC link and nothing shaped.
A DC's ``intra_host`` profile (prediction only: a GPU fabric such as NVLink) replaces it with
each rank's own link out to the host's switch and the receiver's link in, like ``intra``.
"""
from __future__ import annotations

from testbed.topology import Slot
from testbed.topology import LinkProfile, ResolvedLink, Topology
from testbed.sim import calibration as C
from testbed.sim.iteration import UNSHAPED, Path

# The path between two ranks of one host: the bytes never reach a NIC, so neither the DC's
# host link (links.intra_dc) nor an inter-DC link carries them, and no tc qdisc or delay line
# sees them (on netns and Mininet the host is one namespace, on a lab node one kernel). No
# delay and no shaped hop; the bytes move at the rate two processes reach over loopback,
# calibration.UNSHAPED_BYTES_PER_S (gloo, measured: 1.53 GB/s), plus the software latency
# every message pays (calibration.MESSAGE_LATENCY_S).
SAME_HOST = UNSHAPED

# (FIFO name when rate-shaped, bit/s, delay s, queue limit bytes when rate-shaped)
Hop = tuple[str | None, float | None, float, int | None]


def _hop(name: str, p: LinkProfile) -> Hop:
    rate = p.rate_mbit * 1e6 if p.rate_mbit else None
    return (name if rate else None), rate, p.one_way_delay_ms / 1000, p.queue_limit_bytes()


def _combine(hops: list[Hop]) -> Path:
    shaped = [h for h in hops if h[1]]
    slowest = min(shaped, key=lambda h: h[1]) if shaped else None
    return Path(tuple(h[0] for h in shaped), slowest[1] if slowest else None,
                sum(h[2] for h in hops), slowest[3] if slowest else None,
                C.shaper_burst_bytes(slowest[1]) if slowest else 0.0)


class PathModel:
    """The path between any two hosts of a built topology with its resolved inter-DC links."""

    def __init__(self, topology: Topology, links: list[ResolvedLink], connections: int = 1):
        self.topo, self.links = topology, links
        self.routes = topology.routes(links)
        # the most one transfer moves per round trip over its connections (window-limited)
        self.window_bytes = (C.TCP_WINDOW_PER_BUFFER * topology.tcp_buffer_max_mb * (1 << 20)
                             * connections)

    def _inter_hops(self, a: str, b: str) -> list[Hop]:
        out, cur = [], a
        while cur != b:
            nxt = self.routes[cur][b]
            link = next(lk for lk in self.links if {lk.a, lk.b} == {cur, nxt})
            profile = link.a_to_b if cur == link.a else link.b_to_a
            out.append(_hop(f"{cur}->{nxt}", profile))
            cur = nxt
        return out

    def route(self, a: str, b: str) -> list[tuple[str, str]]:
        """The inter-DC link directions (from DC, to DC) bytes from DC ``a`` to DC ``b``
        cross, in order (none inside a DC)."""
        out, cur = [], a
        while cur != b:
            nxt = self.routes[cur][b]
            out.append((cur, nxt))
            cur = nxt
        return out

    def path(self, src: Slot, dst: Slot) -> Path:
        """The path from ``src``'s host to ``dst``'s host (``SAME_HOST`` when they share one)."""
        if src.host == dst.host:
            fabric = self.topo.dc(src.dc).intra_host
            if fabric is None:
                return SAME_HOST
            return _combine([_hop(f"{src.dc}/{src.host_index}.{src.local_rank} out", fabric),
                             _hop(f"{dst.dc}/{dst.host_index}.{dst.local_rank} in", fabric)])
        up = _hop(f"{src.dc}/{src.host_index} up", self.topo.dc(src.dc).intra)
        down = _hop(f"{dst.dc}/{dst.host_index} down", self.topo.dc(dst.dc).intra)
        path = _combine([up, *self._inter_hops(src.dc, dst.dc), down])
        rtt = 2 * path.delay_s
        if rtt <= 0:
            return path
        # a window-limited transfer occupies the path's FIFO at window / RTT; the shaper's
        # token bucket, refilled faster than the window lets bytes out, never holds it back
        window_bps = self.window_bytes * 8 / rtt
        if path.rate_bps is not None and path.rate_bps <= window_bps:
            return path
        return Path(path.hops, window_bps, path.delay_s, path.queue_bytes)

    def between_dcs(self, a: str, b: str) -> Path:
        """The path from a host of DC ``a`` to another host of DC ``b``."""
        return self.path(Slot(0, 0, 0, a, 0), Slot(0, 0, 0, b, 1 if a == b else 0))
