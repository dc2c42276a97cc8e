"""From an experiment (one cell) to the engine's input: the lowered schedule, the emulated
compute times, the bytes per message, and the path between every pair of ranks that talk.

Paths follow the emulated network: a rank's host link to its DC (the DC's ``intra`` profile,
with the experiment's ``links.intra_dc`` on top, shaped at both ends), then the inter-DC links
along ``Topology.routes`` (each direction its own profile), then the receiving host's link.
A path with delay is also capped at what ``workload.connections`` TCP windows move per round
trip (``topology.tcp_buffer_max_mb`` × ``TCP_WINDOW_PER_BUFFER`` each); the cap is applied as
the rate of the path's FIFO, so concurrent transfers on one direction share it.
Placement and schedule are the cell's plan (``testbed.plan``), as the runner ships it to the
workers.
"""
from __future__ import annotations

from testbed.net.topology import LinkProfile
from testbed.placement import Slot
from testbed.schedule.ir import Schedule
from testbed.schedule.lower import lower
from testbed.sim import calibration as C
from testbed.sim.engine import Path, SimInput, StageTimes
from testbed.spec import Experiment
from testbed.spec.workload import (FLOAT32_BYTES, ComputeTimes, bytes_factor, message_bytes,
                                   stage_params)


def _hop(name: str, p: LinkProfile) -> tuple[str | None, float | None, float]:
    """(FIFO name when rate-shaped, rate bit/s, delay s) of one hop."""
    rate = p.rate_mbit * 1e6 if p.rate_mbit else None
    return (name if rate else None), rate, p.one_way_delay_ms / 1000


def _combine(hops: list[tuple[str | None, float | None, float]]) -> Path:
    rates = [r for _, r, _ in hops if r]
    return Path(tuple(n for n, _, _ in hops if n), min(rates) if rates else None,
                sum(d for _, _, d in hops))


class Network:
    """Paths between hosts of one cell's emulated network."""

    def __init__(self, exp: Experiment):
        self.topo = exp.network_topology()
        # the most one transfer moves per round trip over its connections (window-limited)
        self.window_bytes = (C.TCP_WINDOW_PER_BUFFER * self.topo.tcp_buffer_max_mb * (1 << 20)
                             * exp.workload.connections)
        self.links = self.topo.resolved_links(exp.links.inter_dc, exp.links.per_link)
        self.routes = self.topo.routes(self.links)

    def _intra(self, dc: str) -> LinkProfile:
        return self.topo.dc(dc).intra

    def _inter_hops(self, a: str, b: str) -> list[tuple[str | None, float | None, float]]:
        out, cur = [], a
        while cur != b:
            nxt = self.routes[cur][b]
            link = next(lk for lk in self.links if {lk.a, lk.b} == {cur, nxt})
            profile = link.a_to_b if cur == link.a else link.b_to_a
            out.append(_hop(f"{cur}->{nxt}", profile))
            cur = nxt
        return out

    def path(self, src: Slot, dst: Slot) -> Path:
        """The path from ``src``'s host to ``dst``'s host."""
        up = _hop(f"{src.dc}/{src.host_index} up", self._intra(src.dc))
        down = _hop(f"{dst.dc}/{dst.host_index} down", self._intra(dst.dc))
        path = _combine([up, *self._inter_hops(src.dc, dst.dc), down])
        rtt = 2 * path.delay_s
        if rtt <= 0:
            return path
        # a window-limited transfer occupies the path's FIFO at window / RTT
        window_bps = self.window_bytes * 8 / rtt
        if path.rate_bps is not None and path.rate_bps <= window_bps:
            return path
        return Path(path.hops, window_bps, path.delay_s)


def stage_times(exp: Experiment) -> list[StageTimes]:
    """Emulated F/B/W per virtual stage, from the executor's own ``ComputeTimes``; raises
    ValueError when the workload gives neither times nor a device with a known peak."""
    w = exp.workload
    n = w.parallel.pp * w.chunks
    return [ComputeTimes.from_workload(w, s, n) for s in range(n)]


def _allreduce_s(exp: Experiment, net: Network, slots: list[Slot],
                 schedule: Schedule) -> list[float]:
    """Ring all-reduce time of each pipeline rank's gradients over its dp replicas: 2(d−1)
    steps, each moving 1/d of the gradients over the slowest edge of the ring."""
    w = exp.workload
    d, pp, n = w.parallel.dp, w.parallel.pp, w.parallel.pp * w.chunks
    if d == 1:
        return [0.0] * pp
    out = []
    for p in range(pp):
        numel = sum(stage_params(w.model, s, n) for s in schedule.stages_of(p))
        chunk = max(1, int(numel * bytes_factor(w))) * FLOAT32_BYTES / d
        ring = [slots[i * pp + p] for i in range(d)]
        step = max(net.path(a, b).serialization_s(int(chunk)) + net.path(a, b).delay_s
                   + C.MESSAGE_LATENCY_S for a, b in zip(ring, ring[1:] + ring[:1]))
        out.append(2 * (d - 1) * step)
    return out


def sim_input(exp: Experiment, plan=None) -> SimInput:
    """The engine's input for one cell (the experiment with the cell's values set) under
    ``plan`` (a ``testbed.plan.CellPlan``; computed from the experiment when None)."""
    if plan is None:
        from testbed.plan import plan_cell
        plan = plan_cell(exp)
    return build_input(exp, plan.slots, plan.schedule)


def build_input(exp: Experiment, slots: list[Slot], compute_schedule: Schedule) -> SimInput:
    """The engine's input for a given placement and compute-only schedule."""
    w = exp.workload
    pp, dp = w.parallel.pp, w.parallel.dp
    schedule = lower(compute_schedule)
    net = Network(exp)
    paths = {}
    for d in range(dp):
        for a in range(pp):
            for b in range(pp):
                if a != b:
                    src, dst = slots[d * pp + a], slots[d * pp + b]
                    paths[(src.rank, dst.rank)] = net.path(src, dst)
    return SimInput(schedule, stage_times(exp), message_bytes(w), dp, paths,
                    _allreduce_s(exp, net, slots, schedule))
