"""An optical network as data: nodes, fiber links with lengths, DCs attached to nodes and a
frequency-slot grid per fiber.

Every link is a pair of fibers, one per direction, each with its own grid of ``slots``
frequency slots (``slot_ghz`` wide, ``gbps_per_slot`` each at the grid's modulation), so a
lightpath from a to b and one from b to a never compete. A request for n slots occupies
n + ``guard_slots`` contiguous slots (the guard band sits above the n slots).

Small networks are written by hand (a 3-node line with 4 slots is five lines of YAML, see
docs/optical.md); ``nsfnet`` is built in (``testbed.optical.nsfnet``).
"""
from __future__ import annotations

import re

from pydantic import Field, model_validator

from testbed.topology.linkprofile import FIBER_MS_PER_KM, Strict

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$"


class FiberLink(Strict):
    """A link between two nodes: a fiber each way, ``km`` long."""

    a: str = Field(description="one end (a node name)")
    b: str = Field(description="the other end (a node name)")
    km: float = Field(gt=0, le=40_000, description="fiber length; one-way delay 5 µs/km")


class OpticalNetwork(Strict):
    """Nodes, fiber links and the slot grid every fiber has."""

    nodes: list[str] = Field(min_length=2, description="node names")
    links: list[FiberLink] = Field(min_length=1, description="fiber links (one fiber each way)")
    slots: int = Field(80, ge=1, le=1024, description="frequency slots per fiber")
    slot_ghz: float = Field(12.5, gt=0, description="width of one slot")
    gbps_per_slot: float = Field(75.0, gt=0, description="rate one slot carries (64QAM: 75)")
    guard_slots: int = Field(1, ge=0, le=8, description="guard slots after each lightpath")
    dcs: dict[str, str] = Field(default_factory=dict,
                                description="DC name → the node it is attached to")
    domains: dict[str, list[str]] = Field(
        default_factory=dict, description="domain name → its nodes (the cross-domain policy); "
                                          "a node in none is in the domain ''")

    @model_validator(mode="after")
    def _consistent(self) -> "OpticalNetwork":
        names = self.node_names
        if len(set(names)) != len(names):
            raise ValueError(f"node names repeat: {sorted(n for n in names if names.count(n) > 1)}")
        known, seen = set(names), set()
        for i, link in enumerate(self.links):
            for end in (link.a, link.b):
                if end not in known:
                    raise ValueError(f"links[{i}]: unknown node {end!r}; nodes: "
                                     f"{', '.join(names)}")
            pair = frozenset((link.a, link.b))
            if len(pair) == 1:
                raise ValueError(f"links[{i}]: a link joins two different nodes ({link.a})")
            if pair in seen:
                raise ValueError(f"links[{i}]: {link.a}–{link.b} is listed twice")
            seen.add(pair)
        for dc, node in self.dcs.items():
            if node not in known:
                raise ValueError(f"dcs.{dc}: unknown node {node!r}")
        for name, members in self.domains.items():
            for node in members:
                if node not in known:
                    raise ValueError(f"domains.{name}: unknown node {node!r}")
                if self.domain(node) != name:
                    raise ValueError(f"node {node} is in two domains")
        for i, name in enumerate(names):
            if not re.match(NAME, name):
                raise ValueError(f"nodes[{i}]: {name!r} is no node name (letters, digits, "
                                 "_ . -; at most 32)")
        return self

    @property
    def node_names(self) -> list[str]:
        return list(self.nodes)

    def domain(self, node: str) -> str:
        """The (first) domain of ``node``; "" when it is in none."""
        return next((name for name, members in self.domains.items() if node in members), "")

    def fibers(self) -> list[tuple[str, str, float]]:
        """Every fiber (from, to, km): link i's a→b is fiber 2i, its b→a fiber 2i + 1."""
        out = []
        for link in self.links:
            out += [(link.a, link.b, link.km), (link.b, link.a, link.km)]
        return out

    def node_of(self, dc: str) -> str:
        """The node DC ``dc`` is attached to (a node name is its own DC)."""
        return self.dcs.get(dc, dc)

    @staticmethod
    def delay_s(km: float) -> float:
        """One-way propagation over ``km`` of fiber."""
        return km * FIBER_MS_PER_KM / 1000
