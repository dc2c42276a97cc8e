"""Routing and spectrum assignment of lightpath requests, with blocking counted per class.

A request asks for ``slots`` data slots between two nodes at ``t``; it needs ``slots`` +
the grid's guard slots contiguous and free on every fiber of one of its candidate routes (the
k shortest, in the order a routing rule gives). It is *blocked* when no candidate route has
them at ``t``. A blocked background request is lost; what a blocked transfer of a job does is
``testbed.optical.job``'s choice (wait, or fewer slots).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

from testbed.optical.network import OpticalNetwork
from testbed.optical.routes import Route, Router
from testbed.optical.spectrum import Lightpath, Spectrum

# Orders (and may filter) the k shortest routes of a request: how a routing rule picks.
RouteOrder = Callable[[list[Route]], list[Route]]


def in_order(routes: list[Route]) -> list[Route]:
    """KSP-FF's order: shortest first, all k tried."""
    return routes


@dataclass(frozen=True)
class Request:
    """A lightpath request: ``slots`` data slots from node ``src`` to node ``dst`` at ``t``
    for ``hold_s`` seconds; ``kind`` names its class in the blocking counts."""

    src: str
    dst: str
    slots: int
    t: float
    hold_s: float
    kind: str = "background"


class RSA:
    """One network's spectrum over time, its routes and its blocking counts."""

    def __init__(self, net: OpticalNetwork, k: int = 4):
        self.net, self.router = net, Router(net, k)
        self.spectrum = Spectrum(len(net.links) * 2, net.slots)
        self.requests: Counter[str] = Counter()
        self.blocked: Counter[str] = Counter()

    def width(self, slots: int) -> int:
        return slots + self.net.guard_slots

    def routes(self, src: str, dst: str, order: RouteOrder = in_order) -> list[Route]:
        got = order(list(self.router.routes(src, dst)))
        if not got:
            raise ValueError(f"no path from {src} to {dst}")
        return got

    def try_now(self, req: Request, order: RouteOrder = in_order) -> Lightpath | None:
        """First fit at ``req.t`` on the routes ``order`` gives, held ``hold_s``; None when
        blocked. Not counted (``count`` does that)."""
        self.spectrum.advance(req.t)
        got = self.spectrum.fit(self.routes(req.src, req.dst, order), self.width(req.slots))
        if got is None:
            return None
        route, slot = got
        return self.spectrum.hold(route, slot, self.width(req.slots), req.t, req.t + req.hold_s)

    def count(self, kind: str, blocked: bool) -> None:
        self.requests[kind] += 1
        self.blocked[kind] += blocked

    def offer(self, req: Request, order: RouteOrder = in_order) -> Lightpath | None:
        """Route and assign ``req`` (counted); None when it is blocked (and lost)."""
        lp = self.try_now(req, order)
        self.count(req.kind, lp is None)
        return lp

    def blocking(self, kind: str | None = None) -> float:
        """Blocked / offered requests of ``kind`` (all classes when None); nan when none."""
        if kind is None:
            offered, blocked = sum(self.requests.values()), sum(self.blocked.values())
        else:
            offered, blocked = self.requests[kind], self.blocked[kind]
        return blocked / offered if offered else float("nan")
