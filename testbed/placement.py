"""Placement: which host runs which rank.

Global rank = dp_rank × pp + pp_rank (the worker's layout). ``in_order`` cuts the pipeline into
contiguous blocks of stages, one block per DC in file order, so a pipeline crosses every DC
boundary once; DP replica d takes the d-th free host of each DC it uses.
"""
from __future__ import annotations

from dataclasses import dataclass

from testbed.errors import Problem, SpecError
from testbed.net.topology import Topology


@dataclass(frozen=True)
class Slot:
    """Where one rank runs."""

    rank: int
    pp_rank: int
    dp_rank: int
    dc: str
    host_index: int


def stage_dcs(topology: Topology, pp: int) -> list[str]:
    """The DC of each pipeline stage: contiguous blocks, as even as the DC count allows."""
    names = [dc.name for dc in topology.dcs]
    n = min(len(names), pp)
    return [names[s * n // pp] for s in range(pp)]


def in_order(topology: Topology, pp: int, dp: int) -> list[Slot]:
    """One slot per global rank, ordered by rank.

    Raises SpecError when a DC has fewer hosts than the stages × replicas placed in it.
    """
    dcs = stage_dcs(topology, pp)
    used: dict[str, int] = {}
    slots = []
    for d in range(dp):
        for s in range(pp):
            dc = dcs[s]
            j = used.get(dc, 0)
            if j >= topology.dc(dc).hosts:
                need = dcs.count(dc) * dp
                raise SpecError([Problem("placement", 0, 0, "placement",
                                         f"in_order puts {need} ranks in DC {dc}, which has "
                                         f"{topology.dc(dc).hosts} hosts")])
            used[dc] = j + 1
            slots.append(Slot(d * pp + s, s, d, dc, j))
    return slots


PLACEMENTS = {"in_order": in_order}
