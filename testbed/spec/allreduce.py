"""The data-parallel all-reduce as a list of ring steps per rank: what the workers run
(``testbed.train.ring``) and what the simulator times (``testbed.sim.collective``), from the
same function, so a prediction and a run move the same chunks between the same ranks.

A stage's replicas (the ranks with its pipeline rank) all-reduce with one of two algorithms
(``workload.gradient_sync.algorithm``):

- ``ring``: one ring over every replica, ordered by DC (in the order the DCs first hold a
  replica) and then by replica, so it crosses each DC boundary once: reduce-scatter, then
  all-gather, k − 1 steps each for k replicas, each step moving 1/k of the gradients;
- ``hierarchical``: reduce-scatter inside each DC (a ring over its replicas), then an
  all-reduce of each rank's shard between DCs (ring j joins the j-th replica of every DC),
  then all-gather inside each DC. Every DC holding the stage must hold as many of its
  replicas; a ring of one rank has no steps.

Each phase works on a view of the (padded) gradient vector: a reduce-scatter over k ranks cuts
the view into k segments and leaves the rank owning segment (position + 1) mod k, the view of
the next phase; the all-gathers unwind them in reverse order. The vector is padded to a
multiple of the ring sizes' product, so every cut is exact (a few elements at most).
Gradients larger than ``bucket_numel`` are all-reduced in buckets, one after the other.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from testbed.topology import Slot

ALGORITHMS = ("ring", "hierarchical")


@dataclass(frozen=True)
class Step:
    """One ring step of one rank: send ``numel`` elements at ``send_at`` of the bucket's padded
    vector to ``send_to`` while receiving as many from ``recv_from`` into ``recv_at``; add them
    (reduce-scatter) or copy them (all-gather). ``index`` counts the rank's steps over all
    buckets (the same on every rank of the collective: it is the message tag's part)."""

    index: int
    bucket: int
    send_to: int
    recv_from: int
    numel: int
    send_at: int
    recv_at: int
    reduce: bool


def replica_groups(slots: list[Slot], pp_rank: int) -> list[list[int]]:
    """The global ranks of ``pp_rank``'s replicas, grouped by DC (DCs in the order their
    first replica appears), each group ordered by replica."""
    groups: dict[str, list[int]] = {}
    for s in sorted((s for s in slots if s.pp_rank == pp_rank), key=lambda s: s.dp_rank):
        groups.setdefault(s.dc, []).append(s.rank)
    return list(groups.values())


def hierarchy_problem(slots: list[Slot], pp: int) -> str | None:
    """Why ``hierarchical`` cannot run on this placement (DCs holding unequal numbers of a
    stage's replicas), or None."""
    for p in range(pp):
        sizes = [len(g) for g in replica_groups(slots, p)]
        if len(set(sizes)) > 1:
            dcs = sorted({s.dc for s in slots if s.pp_rank == p})
            return (f"gradient_sync hierarchical needs every DC holding stage {p} to hold as "
                    f"many of its replicas; DCs {', '.join(dcs)} hold {sizes}: use algorithm "
                    "ring or a placement with as many replicas in each DC")
    return None


def rings_of(slots: list[Slot], rank: int, algorithm: str,
             groups: list[list[int]] | None = None) -> list[list[int]]:
    """The rings ``rank`` takes part in, outermost (first reduce-scatter) first; rings of one
    rank are left out (``groups``: ``replica_groups`` of its pipeline rank, when known).
    Raises ValueError for an unknown algorithm or an uneven hierarchy."""
    pp_rank = next(s.pp_rank for s in slots if s.rank == rank)
    if groups is None:
        groups = replica_groups(slots, pp_rank)
    if algorithm == "ring":
        rings = [[r for g in groups for r in g]]
    elif algorithm == "hierarchical":
        if len({len(g) for g in groups}) > 1:
            raise ValueError(hierarchy_problem(slots, pp_rank + 1))
        mine = next(g for g in groups if rank in g)
        j = mine.index(rank)
        rings = [mine, [g[j] for g in groups]]
    else:
        raise ValueError(f"unknown gradient_sync algorithm {algorithm!r}; valid: "
                         f"{', '.join(ALGORITHMS)}")
    return [r for r in rings if len(r) > 1]


def padded(numel: int, rings: list[list[int]]) -> int:
    """``numel`` rounded up to a multiple of the rings' sizes' product."""
    k = math.prod(len(r) for r in rings)
    return math.ceil(numel / k) * k


def bucket_sizes(numel: int, bucket_numel: int | None) -> list[int]:
    """The elements of each bucket: ``numel`` cut into ``bucket_numel`` pieces (one bucket when
    None)."""
    if not bucket_numel or bucket_numel >= numel:
        return [numel]
    n = math.ceil(numel / bucket_numel)
    return [bucket_numel] * (n - 1) + [numel - bucket_numel * (n - 1)]


def steps_of(rings: list[list[int]], rank: int, numel: int, bucket: int = 0,
             first_index: int = 0) -> list[Step]:
    """``rank``'s steps of one bucket of ``numel`` elements over ``rings`` (outermost first):
    every reduce-scatter, then the all-gathers in reverse order."""
    steps: list[Step] = []
    views = [(0, padded(numel, rings))]

    where = {id(ring): ring.index(rank) for ring in rings}

    def add(ring, send_seg, recv_seg, size, off, reduce):
        k, pos = len(ring), where[id(ring)]
        c = size // k
        steps.append(Step(first_index + len(steps), bucket, ring[(pos + 1) % k],
                          ring[(pos - 1) % k], c, off + send_seg * c, off + recv_seg * c,
                          reduce))

    for ring in rings:
        off, size = views[-1]
        k, pos = len(ring), where[id(ring)]
        for s in range(k - 1):
            add(ring, (pos - s) % k, (pos - s - 1) % k, size, off, True)
        views.append((off + (pos + 1) % k * (size // k), size // k))
    for ring in reversed(rings):
        views.pop()
        off, size = views[-1]
        k, pos = len(ring), where[id(ring)]
        for s in range(k - 1):
            add(ring, (pos + 1 - s) % k, (pos - s) % k, size, off, False)
    return steps


def rank_steps(slots: list[Slot], rank: int, numel: int, algorithm: str,
               bucket_numel: int | None = None) -> list[Step]:
    """Every step of ``rank``'s all-reduce of ``numel`` gradient elements, bucket after bucket
    (none when the stage has one replica)."""
    rings = rings_of(slots, rank, algorithm)
    out: list[Step] = []
    for b, n in enumerate(bucket_sizes(numel, bucket_numel)):
        out += steps_of(rings, rank, n, b, len(out))
    return out
