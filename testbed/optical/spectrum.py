"""The slot occupancy of every fiber over time, and first-fit under continuity and contiguity.

A fiber's occupancy is an integer bit mask (bit i: slot i). A lightpath holds the same
contiguous block of bits on every fiber of its route (continuity, contiguity) from its start
until its end. Requests must come in time order: ``advance(t)`` first releases every lightpath
that ended at or before t (a slot freed at t is free for a request at t).

A lightpath may also be *reserved*: it waits for spectrum that is still held, and its block is
counted as occupied from the moment it is reserved, so nothing else takes it meanwhile; it
starts holding when the lightpaths in its way have ended.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from testbed.optical.routes import Route

_DEPART, _START = 0, 1  # at one instant, releases come before reservations start holding


@dataclass(frozen=True)
class Lightpath:
    """Spectrum granted to one request: its route, first slot, width (slots incl. guard) and
    when it holds the spectrum."""

    route: Route
    first_slot: int
    width: int
    start_s: float
    end_s: float

    @property
    def mask(self) -> int:
        return ((1 << self.width) - 1) << self.first_slot


def first_fit(occupied: int, width: int, slots: int) -> int | None:
    """The lowest first slot of ``width`` contiguous free slots in a grid of ``slots`` whose
    occupied slots are the bits of ``occupied``; None when there is none."""
    if width > slots:
        return None
    free = ~occupied & ((1 << slots) - 1)
    fits = free
    span = 1
    while span < width and fits:  # fits: bit i set when slots i … i+span−1 are free
        step = min(span, width - span)
        fits &= fits >> step
        span += step
    if not fits:
        return None
    return (fits & -fits).bit_length() - 1


class Spectrum:
    """Occupancy of ``n_fibers`` fibers of ``slots`` slots each."""

    def __init__(self, n_fibers: int, slots: int):
        self.slots = slots
        self.held = [0] * n_fibers
        self.reserved = [0] * n_fibers
        self.events: list[tuple[float, int, int, Lightpath]] = []
        self.seq = 0
        self.now = 0.0

    def occupied(self, route: Route) -> int:
        occ = 0
        for f in route.fibers:
            occ |= self.held[f] | self.reserved[f]
        return occ

    def advance(self, t: float) -> None:
        """Move to time ``t`` (never backwards): end and start lightpaths due by then."""
        if t < self.now - 1e-12:
            raise ValueError(f"requests out of time order: {t} after {self.now}")
        self.now = max(self.now, t)
        while self.events and self.events[0][0] <= t:
            _, kind, _, lp = heapq.heappop(self.events)
            self._apply(kind, lp, self.held, self.reserved)

    @staticmethod
    def _apply(kind: int, lp: Lightpath, held: list[int], reserved: list[int]) -> None:
        for f in lp.route.fibers:
            if kind == _DEPART:
                held[f] &= ~lp.mask
            else:
                reserved[f] &= ~lp.mask
                held[f] |= lp.mask

    def _push(self, t: float, kind: int, lp: Lightpath) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, lp))

    def fit(self, routes: list[Route], width: int) -> tuple[Route, int] | None:
        """First route (in the order given) with ``width`` free contiguous slots now, and the
        first such slot on it."""
        for route in routes:
            slot = first_fit(self.occupied(route), width, self.slots)
            if slot is not None:
                return route, slot
        return None

    def hold(self, route: Route, slot: int, width: int, start: float, end: float) -> Lightpath:
        """Take ``width`` slots from ``slot`` on ``route`` from now (or, reserved, from the
        later ``start``) until ``end``."""
        lp = Lightpath(route, slot, width, start, max(end, start))
        for f in route.fibers:
            if start > self.now:
                self.reserved[f] |= lp.mask
            else:
                self.held[f] |= lp.mask
        if start > self.now:
            self._push(start, _START, lp)
        self._push(lp.end_s, _DEPART, lp)
        return lp

    def earliest_fit(self, routes: list[Route], width: int) -> tuple[float, Route, int] | None:
        """When ``width`` slots first come free on one of ``routes`` as the lightpaths now
        held or reserved end (no new arrivals counted): (time, route, first slot); None when
        not even an empty grid fits ``width``."""
        if width > self.slots:
            return None
        got = self.fit(routes, width)
        if got is not None:
            return (self.now, *got)
        held, reserved = list(self.held), list(self.reserved)
        touched = {f for r in routes for f in r.fibers}
        for t, kind, _, lp in sorted(self.events):
            if not touched.intersection(lp.route.fibers):
                continue
            self._apply(kind, lp, held, reserved)
            for route in routes:
                occ = 0
                for f in route.fibers:
                    occ |= held[f] | reserved[f]
                slot = first_fit(occ, width, self.slots)
                if slot is not None:
                    return t, route, slot
        return None

    def utilization(self) -> float:
        """Share of all fibers' slots held or reserved now."""
        bits = sum(bin(h | r).count("1") for h, r in zip(self.held, self.reserved))
        return bits / (len(self.held) * self.slots)
