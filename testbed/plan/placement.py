"""Placement: which DC and host run each rank.

Global rank = dp_rank × pp + pp_rank (the worker's layout). ``in_order``, ``atlas`` and ``cba``
keep a pipeline stage's DP replicas in one DC (the all-reduce stays inside it);
``dp_across_dcs`` and an explicit map (``testbed.plan.grid``) put replicas in different DCs. A DC holds hosts ×
``ranks_per_host`` ranks: the ranks placed in a DC, in rank order, fill one host before the
next (the DC's k-th rank runs on host k // ranks_per_host as local rank k % ranks_per_host), so
a host's ranks are always in one DC and consecutive stages share a host where they can.
A strategy chooses the DC of each stage:

- ``in_order``: contiguous blocks of stages, one block per DC in file order, as even as the DC
  count allows, so a pipeline crosses every DC boundary once (the baseline);
- ``atlas`` (Atlas-style DC selection): the fewest DCs whose hosts hold the pipeline, and among
  those the set and chain order with the least total boundary cost (one-way delay plus the
  serialization of one activation), filled to capacity in chain order (contiguous blocks);
- ``cba`` (CBA-style, communication-bound-aware): an ILP over stage → DC with per-DC capacity,
  minimising a linear model of the iteration time over heterogeneous links,
  2·Σ boundaries (delay + serialization) + m · max(F + B, slowest boundary's serialization);
  its best few solutions are re-ranked by the simulator's predicted iteration time.

Link costs come from a ``PlacementProblem`` (the caller derives them from the cell's network,
see ``testbed.plan``), so this module needs neither torch nor the simulator.
"""
from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from testbed.errors import Problem, SpecError
from testbed.topology import Slot
from testbed.spec import PLACEMENT_STRATEGIES
from testbed.topology import Topology
from testbed.plan.grid import dp_across_dcs, slots_of
from testbed.spec.models import map_problems

log = logging.getLogger(__name__)

CBA_CANDIDATES = 8  # ILP solutions the simulator re-ranks
ATLAS_MAX_ORDERS = 200_000  # DC subsets × chain orders atlas may enumerate


@dataclass(frozen=True)
class LinkCost:
    """One direction between two DCs' hosts: one-way delay (s) and bottleneck rate (bit/s,
    None = unshaped)."""

    delay_s: float
    rate_bps: float | None


@dataclass
class PlacementProblem:
    """What a link-aware placement is computed from.

    ``cost(a, b)`` is the path from a host of DC a to a host of DC b (a == b: inside a DC);
    ``serialization_s(bytes, cost)`` the time a message occupies that path's bottleneck;
    ``f_s``/``b_s`` one stage's compute per microbatch; ``evaluate(slots)`` (optional) the
    simulator's predicted iteration time of a placement.
    """

    topology: Topology
    pp: int
    dp: int
    microbatches: int
    f_s: float
    b_s: float
    message_bytes: int
    cost: Callable[[str, str], LinkCost]
    serialization_s: Callable[[int, LinkCost], float]
    evaluate: Callable[[list[Slot]], float] | None = None
    ranks_per_host: int = 1

    def boundary_s(self, a: str, b: str) -> tuple[float, float]:
        """(one-way delay, serialization of one message) from DC a to DC b, the slower of the
        two directions (activations go one way, gradients the other)."""
        there, back = self.cost(a, b), self.cost(b, a)
        return (max(there.delay_s, back.delay_s),
                max(self.serialization_s(self.message_bytes, there),
                    self.serialization_s(self.message_bytes, back)))

    def stage_capacity(self) -> dict[str, int]:
        """Stages each DC can hold: hosts × ranks_per_host // dp (all replicas of a stage in
        one DC)."""
        return {dc.name: dc.hosts * self.ranks_per_host // self.dp for dc in self.topology.dcs}

    def linear_time_s(self, dcs: list[str]) -> float:
        """The linear model CBA's ILP minimises, for a stage → DC list."""
        pairs = [self.boundary_s(a, b) for a, b in zip(dcs, dcs[1:])]
        ser = max([s for _, s in pairs], default=0.0)
        return (2 * sum(d + s for d, s in pairs)
                + self.microbatches * max(self.f_s + self.b_s, ser))


def stage_dcs(topology: Topology, pp: int) -> list[str]:
    """The DC of each pipeline stage: contiguous blocks, as even as the DC count allows."""
    names = [dc.name for dc in topology.dcs]
    n = min(len(names), pp)
    return [names[s * n // pp] for s in range(pp)]


def slots_for(topology: Topology, dcs: list[str], dp: int, strategy: str,
              ranks_per_host: int = 1) -> list[Slot]:
    """One slot per global rank (ordered by rank) for stage s of every replica in DC
    ``dcs[s]``, filling a host's ``ranks_per_host`` places before the next host's. Raises
    SpecError when a DC has too few hosts."""
    return slots_of(topology, [list(dcs)] * dp, strategy, ranks_per_host)


def in_order(topology: Topology, pp: int, dp: int, ranks_per_host: int = 1) -> list[Slot]:
    """Contiguous, even stage blocks per DC in file order. Raises SpecError when a DC holds
    fewer ranks than the stages × replicas placed in it."""
    return slots_for(topology, stage_dcs(topology, pp), dp, "in_order", ranks_per_host)


def capacity_problem(topology: Topology, pp: int, dp: int, strategy,
                     ranks_per_host: int = 1) -> str | None:
    """Why ``strategy`` (a name, or a ``PlacementMap``) cannot place pp × dp ranks,
    ``ranks_per_host`` per host, on ``topology``, or None."""
    if not isinstance(strategy, str):
        found = map_problems(topology, strategy.map, pp, dp, ranks_per_host)
        return found[0][1] if found else None
    if strategy in ("in_order", "dp_across_dcs"):
        try:
            place(strategy, topology, pp, dp, lambda: None, ranks_per_host)
        except SpecError as e:
            return e.problems[0].message
        return None
    room = sum(dc.hosts * ranks_per_host // dp for dc in topology.dcs)
    if room < pp:
        return (f"{strategy} keeps a stage's {dp} replica(s) in one DC: the DCs hold "
                f"{room} such stages (ranks_per_host={ranks_per_host}), the pipeline has "
                f"pp={pp}")
    return None


# ---------------------------------------------------------------- Atlas-style DC selection


def atlas(problem: PlacementProblem) -> list[Slot]:
    """The fewest DCs that hold the pipeline; among those, the DC set and chain order whose
    boundaries cost least (Σ one-way delay + serialization); stages fill DCs in chain order."""
    cap = {k: v for k, v in problem.stage_capacity().items() if v > 0}
    names = list(cap)
    best: tuple[float, tuple[str, ...]] | None = None
    for k in range(1, len(names) + 1):
        sets = [c for c in itertools.combinations(names, k) if sum(cap[n] for n in c) >= problem.pp]
        if not sets:
            continue
        if len(sets) * math.factorial(k) > ATLAS_MAX_ORDERS:
            # too many to enumerate: the k largest DCs (they fit, since some k DCs do)
            sets = [tuple(sorted(names, key=lambda n: -cap[n])[:k])]
        for subset in sets:
            for order in itertools.permutations(subset):
                cost = sum(sum(problem.boundary_s(a, b)) for a, b in zip(order, order[1:]))
                if best is None or cost < best[0] - 1e-12:
                    best = (cost, order)
        break
    if best is None:
        raise SpecError([Problem("placement", 0, 0, "placement",
                                 capacity_problem(problem.topology, problem.pp, problem.dp,
                                                  "atlas", problem.ranks_per_host)
                                 or "atlas found no placement")])
    dcs: list[str] = []
    for name in best[1]:
        dcs += [name] * min(cap[name], problem.pp - len(dcs))
    return slots_for(problem.topology, dcs, problem.dp, "atlas", problem.ranks_per_host)


# ---------------------------------------------------------------- CBA-style ILP


def cba_candidates(problem: PlacementProblem, k: int = CBA_CANDIDATES) -> list[list[str]]:
    """Up to ``k`` stage → DC lists, best first by the linear model, from the ILP solved again
    with each found solution excluded (a no-good cut)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    cap = problem.stage_capacity()
    names = [n for n in cap if cap[n] > 0]
    pp, nd = problem.pp, len(names)
    nx, ny = pp * nd, (pp - 1) * nd * nd
    xi = lambda s, d: s * nd + d  # noqa: E731
    yi = lambda s, d, e: nx + (s * nd + d) * nd + e  # noqa: E731
    z = nx + ny
    n = z + 1
    cost = np.zeros(n)
    rows, lo, hi = [], [], []

    def row(entries: dict[int, float], low: float, high: float) -> None:
        r = np.zeros(n)
        for i, v in entries.items():
            r[i] += v
        rows.append(r)
        lo.append(low)
        hi.append(high)

    for s in range(pp):  # every stage in exactly one DC
        row({xi(s, d): 1 for d in range(nd)}, 1, 1)
    for d, name in enumerate(names):  # capacity
        row({xi(s, d): 1 for s in range(pp)}, 0, cap[name])
    for s in range(pp - 1):
        row({yi(s, d, e): 1 for d in range(nd) for e in range(nd)}, 1, 1)
        ser = {}
        for d, a in enumerate(names):
            for e, b in enumerate(names):
                delay, sr = problem.boundary_s(a, b)
                cost[yi(s, d, e)] = 2 * (delay + sr)
                ser[yi(s, d, e)] = -sr
                # y ≥ x[s,d] + x[s+1,e] − 1
                row({xi(s, d): 1, xi(s + 1, e): 1, yi(s, d, e): -1}, -np.inf, 1)
        row({z: 1, **ser}, 0, np.inf)  # z ≥ the boundary's serialization
    cost[z] = problem.microbatches
    lower = np.zeros(n)
    lower[z] = problem.f_s + problem.b_s
    upper = np.ones(n)
    upper[z] = np.inf
    integrality = np.zeros(n)
    integrality[:nx] = 1
    out: list[list[str]] = []
    for _ in range(k):
        res = milp(cost, integrality=integrality, bounds=Bounds(lower, upper),
                   constraints=LinearConstraint(np.array(rows), lo, hi),
                   options={"time_limit": 30})
        if res.x is None:
            break
        x = np.round(res.x[:nx]).reshape(pp, nd)
        out.append([names[int(np.argmax(x[s]))] for s in range(pp)])
        ones = {xi(s, int(np.argmax(x[s]))): 1 for s in range(pp)}
        row(ones, -np.inf, pp - 1)  # exclude this assignment from now on
    return out


def cba(problem: PlacementProblem) -> list[Slot]:
    """The ILP's best assignments, re-ranked by ``problem.evaluate`` (the simulator) when
    given; the linear model's best otherwise."""
    cands = cba_candidates(problem)
    if not cands:
        raise SpecError([Problem("placement", 0, 0, "placement",
                                 capacity_problem(problem.topology, problem.pp, problem.dp, "cba",
                                                  problem.ranks_per_host)
                                 or "the CBA ILP found no placement")])
    placed = [slots_for(problem.topology, c, problem.dp, "cba", problem.ranks_per_host)
              for c in cands]
    if problem.evaluate is None:
        return placed[0]
    times = [problem.evaluate(p) for p in placed]
    best = min(range(len(placed)), key=lambda i: (times[i], i))
    log.info("cba: %d ILP candidates, simulator %s s; chose %s", len(cands),
             ", ".join(f"{t:.3f}" for t in times), cands[best])
    return placed[best]


def place(strategy, topology: Topology, pp: int, dp: int,
          problem: Callable[[], PlacementProblem], ranks_per_host: int = 1) -> list[Slot]:
    """The slots of ``strategy`` (one of PLACEMENT_STRATEGIES, or a ``PlacementMap``: its map
    as written), ``ranks_per_host`` ranks per host; ``problem`` builds the link costs (with
    the same ``ranks_per_host``), which only the link-aware strategies ask for. Raises
    SpecError when it cannot place."""
    if not isinstance(strategy, str):
        found = map_problems(topology, strategy.map, pp, dp, ranks_per_host)
        if found:
            raise SpecError([Problem("placement", 0, 0, "placement", found[0][1])])
        return slots_of(topology, strategy.map, "placement map", ranks_per_host)
    if strategy == "in_order":
        return in_order(topology, pp, dp, ranks_per_host)
    if strategy == "dp_across_dcs":
        return slots_of(topology, dp_across_dcs(topology, pp, dp, ranks_per_host),
                        strategy, ranks_per_host)
    link_aware = {"atlas": atlas, "cba": cba}
    if strategy not in link_aware:
        raise ValueError(f"unknown placement {strategy!r}; valid: {', '.join(PLACEMENT_STRATEGIES)}")
    return link_aware[strategy](problem())
