"""The slots of emulated link directions under a controller (``controller:`` in the
experiment file; ``testbed.runner.controller`` plays it on a running cell).

A link direction is named ``<link>:<from DC>-><to DC>``. Each iteration the policy asks for
slots per direction (CBA's rule, ``testbed.optical.policy.cba_slots``, or ``fixed``); a link's
two directions share ``link_slots``: where both asks fit, both are granted; where they do not,
the direction whose receivers waited longer gets its ask (at most ``link_slots − low``) and the
other the rest. A direction granted fewer slots than it asked for was blocked, and CBA's rule
asks one fewer for it next time.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from testbed.optical.policy import SlotBounds, cba_slots
from testbed.spec.controller import Controller


def direction(link: str, src: str, dst: str) -> str:
    return f"{link}:{src}->{dst}"


@dataclass
class Allocation:
    """The slots of every driven link direction, and what the last decision saw."""

    spec: Controller
    pairs: dict[str, tuple[str, str]]  # link → its two direction names
    asked: dict[str, int] = field(default_factory=dict)
    granted: dict[str, int] = field(default_factory=dict)
    blocked: dict[str, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        s = self.spec.slots
        self.bounds = SlotBounds(initial=s.initial, low=s.low, high=s.high)
        for a, b in self.pairs.values():
            for d in (a, b):
                self.asked[d] = s.initial
        self._grant({d: 0.0 for d in self.asked})

    def rate_mbit(self, d: str) -> float:
        return self.granted[d] * self.spec.rate_per_slot_mbit

    def decide(self, waits_s: dict[str, float]) -> dict[str, int]:
        """The next slots of every direction from the last iteration's receiver waits on each
        (s); returns the grant."""
        if self.spec.policy == "cba":
            threshold = self.spec.wait_threshold_ms / 1000
            self.asked = {d: cba_slots(self.granted[d], self.blocked[d], waits_s.get(d, 0.0),
                                       threshold, self.bounds) for d in self.asked}
        return self._grant(waits_s)

    def _grant(self, waits_s: dict[str, float]) -> dict[str, int]:
        total, low = self.spec.link_slots, self.bounds.low
        for a, b in self.pairs.values():
            ask_a, ask_b = self.asked[a], self.asked[b]
            if ask_a + ask_b <= total:
                got = {a: ask_a, b: ask_b}
            else:
                first, second = (a, b) if waits_s.get(a, 0.0) >= waits_s.get(b, 0.0) else (b, a)
                took = min(self.asked[first], total - low)
                got = {first: took, second: total - took}
            for d in (a, b):
                self.granted[d] = got[d]
                self.blocked[d] = got[d] < self.asked[d]
        return dict(self.granted)
