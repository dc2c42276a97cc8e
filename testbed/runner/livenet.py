"""The network a sweep's cells run on, kept up across consecutive cells with the same topology.

Building a network and starting its delay lines costs every cell the same; most sweeps vary the
links, the schedule or the workload over one topology. So the network stays up while the next
cell's topology (DCs, hosts, intra-DC profiles, the set of inter-DC links) is the same, and only
links whose profile differs from what is in force are re-shaped (``Shaper.update`` reads each
back). A different topology, a cell that failed, or a shaper part that died (a delay line
killed between cells) brings up a fresh network.

Link measurement (ping, iperf3) is the other fixed cost: it is made once per distinct link state
on one network and handed to every row measured under that state, with the cell that measured
it (``links_measured_in``); re-shaping to another state measures again.
"""
from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable

from testbed.errors import ShapingError
from testbed.topology import LinkProfile
from testbed.net.backends.base import Backend
from testbed.net.linkprobe import LinkMeasurement, probe_link
from testbed.net.network import Network
from testbed.net.shaping.interface import Shaper
from testbed.plan import CellPlan
from testbed.readout import columns
from testbed.topology import ResolvedLink

log = logging.getLogger(__name__)


def topology_key(plan: CellPlan) -> str:
    """What must be equal for two cells to share a network: the topology and shaper input
    that building depends on (everything but the inter-DC links' profiles)."""
    ends = [(ln.index, ln.a, ln.b, str(ln.transit)) for ln in plan.links]
    return plan.topology.model_dump_json() + repr(ends)


def link_state(link: ResolvedLink, a_to_b: LinkProfile, b_to_a: LinkProfile) -> str:
    """A link's state as measured: its index and both directions' profiles."""
    return f"{link.index}:{a_to_b.model_dump_json()}|{b_to_a.model_dump_json()}"


class LiveNetwork:
    """Owns the current network; ``close`` tears it down (also on failure or interrupt)."""

    def __init__(self, backend: Backend, shaper_name: str):
        self.backend, self.shaper_name = backend, shaper_name
        self.net: Network | None = None
        self.shaper: Shaper | None = None
        self._key: str | None = None
        self._stack: ExitStack | None = None
        self._measured: dict[str, tuple[dict[str, Any], str]] = {}

    def acquire(self, plan: CellPlan, workdir: Path) -> tuple[Network, Shaper]:
        """The network for ``plan``, shaped as its links start and read back: the current one
        re-shaped where needed, or a new one (its records in ``workdir``)."""
        key = topology_key(plan)
        if key == self._key and self._alive() and self._reshape(plan.links):
            return self.net, self.shaper
        self.close()
        stack = ExitStack()
        try:
            self.net, self.shaper = self.backend.bring_up(plan.topology, plan.links,
                                                          self.shaper_name, workdir, stack)
        except BaseException:
            stack.close()
            raise
        self._stack, self._key = stack, key
        return self.net, self.shaper

    def close(self) -> None:
        """Tear the current network down (nothing to do without one)."""
        stack, self._stack, self._key = self._stack, None, None
        self.net = self.shaper = None
        self._measured.clear()
        if stack is not None:
            stack.close()

    def measured_links(self, plan: CellPlan, here: str,
                       watch: Callable[[], None] | None = None) -> dict[str, Any]:
        """The link columns of every inter-DC link: configured, and measured RTT (and rate
        where shaped), from this network's measurement of the same link state when there is
        one, else measured now; ``here`` names this cell for ``links_measured_in``. ``watch``
        is called while a probe runs (see ``probe_link``)."""
        out: dict[str, Any] = {}
        where = set()
        for link in plan.links:
            state = link_state(link, link.a_to_b, link.b_to_a)
            if not plan.experiment.measure_links:
                m, at = LinkMeasurement(link.name, 0.0, None).as_dict(), ""
            elif state in self._measured:
                m, at = self._measured[state]
            else:
                m = probe_link(self.net, link, rate=link.a_to_b.rate_mbit is not None,
                               watch=watch).as_dict()
                at = here
                self._measured[state] = (m, at)
                log.info("link %s measured: %s", link.name, m)
            where.add(at)
            out.update(columns.link_columns(link, m))
        out["links_measured_in"] = " ".join(sorted(w for w in where if w))
        return out

    def _alive(self) -> bool:
        """Whether the shaper's processes all still run (a delay line may have died since the
        cell before); False (logged) means a fresh network."""
        try:
            self.shaper.check_alive()
        except ShapingError as e:
            log.warning("%s since the cell before; building a new network", e)
            return False
        return True

    def _reshape(self, links: list[ResolvedLink]) -> bool:
        """Give each link its starting profile where another is in force; False when the
        shaper cannot tell (the caller then builds afresh)."""
        if any(self.shaper.in_force(link.index) is None for link in links):
            return False
        for link in links:
            if self.shaper.in_force(link.index) != (link.a_to_b, link.b_to_a):
                log.info("link %s re-shaped for the next cell", link.name)
                self.shaper.update(link.index, link.a_to_b, link.b_to_a)
        return True
