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
  then all-gather inside each DC; a ring of one rank has no steps. DCs may hold unequal
  numbers of the stage's replicas (``uneven_steps``): the shards then differ in size from DC
  to DC, and the vector is cut where any DC's shard ends; each piece is all-reduced between
  DCs by a ring of its owners, one in each DC, piece after piece. A rank waits out (an
  ``IDLE`` step, nothing sent) the steps of pieces it does not own and, inside a DC of fewer
  replicas, the reduce-scatter steps other DCs still take, so that step i of every rank is
  the same step of the collective (the workers tag messages with it, the simulator pairs
  transfers by it).

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
# send_to and recv_from of a step in which a rank waits while others take theirs
IDLE = -1


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

    @property
    def idle(self) -> bool:
        """Nothing to send or receive: the rank waits this step out (``uneven_steps``)."""
        return self.send_to == IDLE


def replica_groups(slots: list[Slot], pp_rank: int) -> list[list[int]]:
    """The global ranks of ``pp_rank``'s replicas, grouped by DC (DCs in the order their
    first replica appears), each group ordered by replica."""
    groups: dict[str, list[int]] = {}
    for s in sorted((s for s in slots if s.pp_rank == pp_rank), key=lambda s: s.dp_rank):
        groups.setdefault(s.dc, []).append(s.rank)
    return list(groups.values())


def rings_of(groups: list[list[int]], rank: int, algorithm: str) -> list[list[int]]:
    """The rings ``rank`` takes part in, outermost (first reduce-scatter) first, among its
    pipeline rank's ``replica_groups``; rings of one rank are left out. Raises ValueError for
    an unknown algorithm, or for ``hierarchical`` over DCs of unequal replica counts (those
    are not nested rings: ``uneven_steps``)."""
    if algorithm == "ring":
        rings = [[r for g in groups for r in g]]
    elif algorithm == "hierarchical":
        if uneven(groups):
            raise ValueError("hierarchical over unequal DCs is not nested rings: uneven_steps")
        mine = next(g for g in groups if rank in g)
        j = mine.index(rank)
        rings = [mine, [g[j] for g in groups]]
    else:
        raise ValueError(f"unknown gradient_sync algorithm {algorithm!r}; valid: "
                         f"{', '.join(ALGORITHMS)}")
    return [r for r in rings if len(r) > 1]


def uneven(groups: list[list[int]]) -> bool:
    """Whether the DCs hold unequal numbers of the stage's replicas."""
    return len({len(g) for g in groups}) > 1


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


def uneven_steps(groups: list[list[int]], rank: int, numel: int, bucket: int = 0,
                 first_index: int = 0) -> list[Step]:
    """``rank``'s steps of one bucket of ``numel`` elements, hierarchical over DCs that hold
    unequal numbers of the replicas (``groups``, one list per DC): reduce-scatter inside the
    DC (k − 1 steps for k replicas, then ``IDLE`` up to the largest DC's), an all-reduce
    between DCs of every piece of the vector whose owner is the same rank in each DC (cut
    where any DC's shard ends; a ring of the D owners, 2(D − 1) steps, ``IDLE`` for a rank
    that owns none of it), then all-gather inside the DC (``IDLE`` again up to the largest
    DC's). The vector is padded to a multiple
    of D × the least common multiple of the DCs' replica counts, so every cut is exact."""
    sizes = [len(g) for g in groups]
    dcs, unit = len(groups), math.lcm(*sizes) * len(groups)
    n = math.ceil(numel / unit) * unit
    mine = next(g for g in groups if rank in g)
    here, k, pos = groups.index(mine), len(mine), mine.index(rank)
    steps: list[Step] = []

    def add(to: int, frm: int, c: int, off: int, send_seg: int, recv_seg: int, reduce: bool):
        steps.append(Step(first_index + len(steps), bucket, to, frm, c, off + send_seg * c,
                          off + recv_seg * c, reduce))

    def wait(count: int) -> None:
        for _ in range(count):
            steps.append(Step(first_index + len(steps), bucket, IDLE, IDLE, 0, 0, 0, False))

    nxt, prv, shard = mine[(pos + 1) % k], mine[(pos - 1) % k], n // k
    for s in range(k - 1):  # after it, position pos owns shard (pos + 1) mod k
        add(nxt, prv, shard, 0, (pos - s) % k, (pos - s - 1) % k, True)
    wait(max(sizes) - k)
    cuts = sorted({i * n // size for size in set(sizes) for i in range(size + 1)})
    for a, b in zip(cuts, cuts[1:]):
        owners = [g[(a * len(g) // n - 1) % len(g)] for g in groups]
        if owners[here] != rank:
            wait(2 * (dcs - 1))
            continue
        to, frm, c = owners[(here + 1) % dcs], owners[(here - 1) % dcs], (b - a) // dcs
        for s in range(dcs - 1):
            add(to, frm, c, a, (here - s) % dcs, (here - s - 1) % dcs, True)
        for s in range(dcs - 1):
            add(to, frm, c, a, (here + 1 - s) % dcs, (here - s) % dcs, False)
    for s in range(k - 1):
        add(nxt, prv, shard, 0, (pos + 1 - s) % k, (pos - s) % k, False)
    wait(max(sizes) - k)  # every rank has as many steps
    return steps


def group_steps(groups: list[list[int]], rank: int, numel: int, algorithm: str,
                bucket_numel: int | None = None) -> list[Step]:
    """Every step of ``rank``'s all-reduce of ``numel`` elements among its pipeline rank's
    ``replica_groups``, bucket after bucket (none when the stage has one replica)."""
    if algorithm == "hierarchical" and uneven(groups):
        def bucket_steps(n: int, b: int, first: int) -> list[Step]:
            return uneven_steps(groups, rank, n, b, first)
    else:
        rings = rings_of(groups, rank, algorithm)
        if not rings:
            return []

        def bucket_steps(n: int, b: int, first: int) -> list[Step]:
            return steps_of(rings, rank, n, b, first)
    out: list[Step] = []
    for b, n in enumerate(bucket_sizes(numel, bucket_numel)):
        out += bucket_steps(n, b, len(out))
    return out


def rank_steps(slots: list[Slot], rank: int, numel: int, algorithm: str,
               bucket_numel: int | None = None) -> list[Step]:
    """Every step of ``rank``'s all-reduce of ``numel`` gradient elements, bucket after bucket
    (none when the stage has one replica)."""
    pp_rank = next(s.pp_rank for s in slots if s.rank == rank)
    return group_steps(replica_groups(slots, pp_rank), rank, numel, algorithm, bucket_numel)
