"""Placement grids: the DC of every (replica, stage) and the slots (hosts) they become.

A grid is ``grid[d][s]``, the DC of data-parallel replica d's pipeline stage s; global rank
d × pp + s. Every placement ends as one: ``in_order``, ``atlas`` and ``cba`` give each stage
one DC for all its replicas (the same row dp times), ``dp_across_dcs`` keeps each replica's
whole pipeline in one DC and spreads the replicas over DCs, and an explicit ``placement:
{map: …}`` is one as written. The ranks placed in a DC, in rank order, fill one host (its
``ranks_per_host`` places) before the next.
"""
from __future__ import annotations

from collections import Counter

from testbed.errors import Problem, SpecError
from testbed.spec.models import map_problems, overfull, room
from testbed.topology import Slot, Topology

Grid = list[list[str]]


def slots_of(topology: Topology, grid: Grid, strategy: str, ranks_per_host: int = 1) -> list[Slot]:
    """One slot per global rank (ordered by rank): rank d × pp + s in DC ``grid[d][s]``, on its
    DC's next free place. Raises SpecError when a DC has too few hosts."""
    why = overfull(topology, grid, ranks_per_host, strategy)
    if why:
        raise SpecError([Problem("placement", 0, 0, "placement", why)])
    pp = len(grid[0])
    used: Counter = Counter()
    slots = []
    for d, row in enumerate(grid):
        for s, dc in enumerate(row):
            k = used[dc]
            used[dc] += 1
            slots.append(Slot(d * pp + s, s, d, dc, k // ranks_per_host, k % ranks_per_host))
    return slots


def dp_across_dcs(topology: Topology, pp: int, dp: int, ranks_per_host: int = 1) -> Grid:
    """Whole pipelines inside DCs, the replicas spread over DCs: replica d goes to the next DC,
    round robin in file order, that still has room for its pp stages. Raises SpecError when
    the DCs hold fewer than dp whole pipelines."""
    names = [dc.name for dc in topology.dcs]
    free = {n: room(topology, n, ranks_per_host) for n in names}
    grid, cursor = [], 0
    for _ in range(dp):
        order = names[cursor:] + names[:cursor]
        dc = next((n for n in order if free[n] >= pp), None)
        if dc is None:
            whole = sum(room(topology, n, ranks_per_host) // pp for n in names)
            raise SpecError([Problem("placement", 0, 0, "placement",
                                     f"dp_across_dcs keeps each replica's {pp} stages in one "
                                     f"DC: the DCs hold {whole} such pipelines "
                                     f"(ranks_per_host={ranks_per_host}), the job has dp={dp}")])
        free[dc] -= pp
        grid.append([dc] * pp)
        cursor = (names.index(dc) + 1) % len(names)
    return grid


def replicas_by_dc(grid: Grid, stage: int) -> dict[str, list[int]]:
    """The replicas of ``stage`` in each DC (DCs in the order their first replica appears)."""
    out: dict[str, list[int]] = {}
    for d, row in enumerate(grid):
        out.setdefault(row[stage], []).append(d)
    return out


def grid_text(grid: Grid) -> str:
    """The grid as the results row's ``placement_map`` records it: each replica's stage DCs,
    replicas separated by ``|`` (``dc1 dc1 | dc2 dc2``)."""
    return " | ".join(" ".join(row) for row in grid)
