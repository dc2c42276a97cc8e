"""Policies: which routes a request tries (for every request on the network) and how many
slots each transfer of the job asks for (from what the last iteration showed).

A policy is a class with three methods, all with defaults here in ``Policy``:

- ``order(routes)``: the k shortest routes of a request, reordered or filtered; the first
  with room wins (first-fit on each);
- ``slots(transfer)``: data slots the job's ``transfer`` asks for this iteration;
- ``observe(outcomes)``: what each transfer of the iteration that ended got and did.

Built in: ``ksp_ff`` (k shortest paths, first fit), ``sd_ff`` (the shortest path only, first
fit), ``cross_domain`` (fewest domain borders crossed, then shortest) and each of them with
CBA's slot rule (``ksp_ff+cba`` …). A policy in a file of one's own is named by its path
(``policies/mine.py`` or ``policies/mine.py:ClassName``): ``testbed.optical.plugins``.
"""
from __future__ import annotations

from dataclasses import dataclass

from testbed.optical.network import OpticalNetwork
from testbed.optical.routes import Route


@dataclass(frozen=True)
class TransferId:
    """One transfer of the job, the same in every iteration: direction ("F": activations
    forward, "B": gradients backward), the sending stage and the microbatch."""

    direction: str
    stage: int
    microbatch: int


@dataclass(frozen=True)
class TransferOutcome:
    """What one transfer asked for and got in an iteration, and how long its receiver waited
    on it (``receiver_wait_s``: time the receiving stage was blocked while the transfer was
    under way, from its SEND to its arrival)."""

    transfer: TransferId
    asked: int
    got: int
    blocked: bool
    receiver_wait_s: float


@dataclass(frozen=True)
class SlotBounds:
    """The slots a transfer may ask for: it starts at ``initial`` and stays in [low, high]."""

    initial: int = 3
    low: int = 1
    high: int = 6

    def clamp(self, n: int) -> int:
        return max(self.low, min(self.high, n))


class Policy:
    """KSP-FF with a fixed number of slots per transfer: the base of every policy."""

    name = "ksp_ff"

    def __init__(self, net: OpticalNetwork, bounds: SlotBounds):
        self.net, self.bounds = net, bounds

    def order(self, routes: list[Route]) -> list[Route]:
        return routes

    def slots(self, transfer: TransferId) -> int:
        return self.bounds.initial

    def observe(self, outcomes: list[TransferOutcome]) -> None:
        """Nothing to learn for a fixed allocation."""


class ShortestOnly(Policy):
    """SD-FF: the shortest-distance route only, first fit."""

    name = "sd_ff"

    def order(self, routes: list[Route]) -> list[Route]:
        return routes[:1]


class CrossDomain(Policy):
    """The route crossing the fewest domain borders (``OpticalNetwork.domains``), shortest
    first among equals: lightpaths stay inside a domain where they can."""

    name = "cross_domain"

    def __init__(self, net: OpticalNetwork, bounds: SlotBounds):
        super().__init__(net, bounds)
        self.domain_of = {n: net.domain(n) for n in net.node_names}
        self.orders: dict[tuple[int, ...], tuple[list[Route], list[Route]]] = {}

    def borders(self, route: Route) -> int:
        d = [self.domain_of[n] for n in route.nodes]
        return sum(a != b for a, b in zip(d, d[1:]))

    def order(self, routes: list[Route]) -> list[Route]:
        key = tuple(map(id, routes))  # the router's own Route objects: hashing them is slow
        if key not in self.orders:
            self.orders[key] = (routes, sorted(routes, key=lambda r: (self.borders(r), r.km)))
        return self.orders[key][1]


class Cba:
    """CBA's rule over a routing policy: a transfer whose receiver waited on it longer than
    ``wait_threshold_s`` in the last iteration (communication-bound) asks for ``up`` more
    slots; one that was blocked asks for ``down`` fewer; both within the bounds."""

    def __init__(self, routing: Policy, up: int = 1, down: int = 1,
                 wait_threshold_s: float = 1e-3):
        self.routing, self.up, self.down, self.threshold = routing, up, down, wait_threshold_s
        self.name = f"{routing.name}+cba"
        self.asked: dict[TransferId, int] = {}

    def order(self, routes: list[Route]) -> list[Route]:
        return self.routing.order(routes)

    def slots(self, transfer: TransferId) -> int:
        return self.asked.get(transfer, self.routing.bounds.initial)

    def observe(self, outcomes: list[TransferOutcome]) -> None:
        for o in outcomes:
            self.asked[o.transfer] = cba_slots(o.asked, o.blocked, o.receiver_wait_s,
                                               self.threshold, self.routing.bounds, self.up,
                                               self.down)


def cba_slots(asked: int, blocked: bool, wait_s: float, threshold_s: float,
              bounds: SlotBounds, up: int = 1, down: int = 1) -> int:
    """CBA's rule for one transfer (or one link direction): what it asks for next, from what
    it asked for now: ``down`` fewer if it was blocked, else ``up`` more if its receiver waited
    on it longer than ``threshold_s`` (communication-bound), within ``bounds``."""
    n = asked
    if blocked:
        n -= down
    elif wait_s > threshold_s:
        n += up
    return bounds.clamp(n)


ROUTING = {p.name: p for p in (Policy, ShortestOnly, CrossDomain)}
BUILT_IN = tuple(ROUTING) + tuple(f"{n}+cba" for n in ROUTING)


def built_in(name: str, net: OpticalNetwork, bounds: SlotBounds, wait_threshold_s: float):
    """A built-in policy by name (``BUILT_IN``); raises ValueError for another."""
    routing, _, rule = name.partition("+")
    if routing not in ROUTING or rule not in ("", "cba"):
        raise ValueError(f"unknown policy {name!r}; built in: {', '.join(BUILT_IN)}, or a "
                         "path to a .py file")
    policy = ROUTING[routing](net, bounds)
    return Cba(policy, wait_threshold_s=wait_threshold_s) if rule else policy
