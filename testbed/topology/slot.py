"""Where each rank runs: a ``Slot`` per rank, the placement's output (``testbed.plan.placement``)
that the cell file carries to every worker and the simulator reads. Pure data."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Slot:
    """Where one rank runs: its global rank (dp_rank × pp + pp_rank), its pipeline and
    data-parallel ranks, the DC and host index within that DC, and its rank among the ranks
    of that host (``LOCAL_RANK``; 0 with one rank per host, and in cell files written before
    ``workload.ranks_per_host`` existed)."""

    rank: int
    pp_rank: int
    dp_rank: int
    dc: str
    host_index: int
    local_rank: int = 0

    @property
    def host(self) -> tuple[str, int]:
        """(DC, host index): the host this rank shares with its other local ranks."""
        return self.dc, self.host_index


def local_world_sizes(slots: list[Slot]) -> dict[tuple[str, int], int]:
    """How many ranks each used host runs (``LOCAL_WORLD_SIZE``), keyed by ``Slot.host``."""
    out: dict[tuple[str, int], int] = {}
    for s in slots:
        out[s.host] = out.get(s.host, 0) + 1
    return out


def single_host_placement(pp: int, dp: int, dc: str = "local") -> list[Slot]:
    """Every rank of a pp × dp job on one host (loopback runs); local rank = global rank."""
    return [Slot(d * pp + s, s, d, dc, 0, d * pp + s) for d in range(dp) for s in range(pp)]
