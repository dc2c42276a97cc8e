"""Background lightpath traffic, seeded and deterministic.

- ``BurstTraffic``: at each cross-DC transfer event of the job, with probability ``p``,
  ``requests`` lightpath requests arrive at once (CBA's setup: p = 0.95, 60 requests);
- ``PoissonTraffic``: Poisson arrivals offering ``erlangs`` of load (arrival rate × mean
  holding time), independent of the job;
- ``ListedTraffic``: requests written out one by one (hand-made cases with known blocking).

Each request joins two distinct nodes drawn uniformly, asks for a whole number of slots drawn
uniformly from ``slots`` (inclusive) and is held for an exponential time of mean ``hold_s``.
All are offered with the routing rule of the network (``RSA.offer``); a blocked one is lost.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from testbed.optical.rsa import RSA, Request, RouteOrder, in_order


@dataclass
class _Draw:
    nodes: list[str]
    slots: tuple[int, int]
    hold_s: float
    rng: random.Random

    def request(self, t: float) -> Request:
        src, dst = self.rng.sample(self.nodes, 2)
        return Request(src, dst, self.rng.randint(*self.slots), t,
                       self.rng.expovariate(1 / self.hold_s))


class Traffic:
    """No background traffic; the base of the others."""

    def on_event(self, rsa: RSA, t: float, order: RouteOrder = in_order) -> None:
        """A transfer event of the job at ``t`` (after ``until(t)``)."""

    def until(self, rsa: RSA, t: float, order: RouteOrder = in_order) -> None:
        """Offer every independent arrival up to ``t``."""


class BurstTraffic(Traffic):
    def __init__(self, nodes: list[str], p: float, requests: int, slots: tuple[int, int],
                 hold_s: float, seed: int):
        self.p, self.n = p, requests
        self.draw = _Draw(nodes, slots, hold_s, random.Random(seed))

    def on_event(self, rsa: RSA, t: float, order: RouteOrder = in_order) -> None:
        if self.draw.rng.random() >= self.p:
            return
        for _ in range(self.n):
            rsa.offer(self.draw.request(t), order)


class PoissonTraffic(Traffic):
    def __init__(self, nodes: list[str], erlangs: float, slots: tuple[int, int],
                 hold_s: float, seed: int):
        self.rate = erlangs / hold_s
        self.draw = _Draw(nodes, slots, hold_s, random.Random(seed))
        self.next_t = self.draw.rng.expovariate(self.rate) if self.rate > 0 else float("inf")

    def until(self, rsa: RSA, t: float, order: RouteOrder = in_order) -> None:
        while self.next_t <= t:
            rsa.offer(self.draw.request(self.next_t), order)
            self.next_t += self.draw.rng.expovariate(self.rate)


@dataclass
class ListedTraffic(Traffic):
    """Requests given one by one, offered in time order."""

    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.requests = sorted(self.requests, key=lambda r: r.t)
        self.pos = 0

    def until(self, rsa: RSA, t: float, order: RouteOrder = in_order) -> None:
        while self.pos < len(self.requests) and self.requests[self.pos].t <= t:
            rsa.offer(self.requests[self.pos], order)
            self.pos += 1
