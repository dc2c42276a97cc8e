"""Each rank's spans of one simulated iteration, kept compact while the engine runs and made into
``Span`` tuples only when they are read.

A cell of thousands of ranks runs millions of actions; as tuples they would take gigabytes and
every pass of Python's garbage collector would walk them. So the engine keeps, per rank, when
its first action started and when each action ended. An action starts ``gap`` after the
previous one ended (the engine computes the next start as that same addition, so recomputing it
gives the same float); a receive that waited for its message started there too and ended when
the message arrived. The rank's other records (its final waits, its all-reduce steps) are kept
as they are made.
"""
from __future__ import annotations

from collections import defaultdict
from operator import attrgetter

from testbed.sim.iteration import Span

_T0 = attrgetter("t0")


class Timeline:
    """``ends[r]``: when each of rank ``r``'s actions ended, in its list's order, the first
    starting at ``start[r]``; ``labels[p]``: each action of pipeline rank ``p`` as (kind,
    stage, microbatch, category). ``append`` takes any other span (``allreduce`` keeps the
    all-reduce's, by rank)."""

    def __init__(self, world: int, pp: int, labels: list[list[tuple]], gap: float):
        self.world, self.pp, self.labels, self.gap = world, pp, labels, gap
        self.start = [0.0] * world
        self.ends: list[list[float]] = [[] for _ in range(world)]
        self.extra: list[list[Span]] = [[] for _ in range(world)]
        self.allreduce: dict[int, list[Span]] = defaultdict(list)

    def append(self, sp: Span) -> None:
        self.extra[sp.rank].append(sp)
        if sp.kind.startswith("ALLREDUCE"):
            self.allreduce[sp.rank].append(sp)

    def sort_allreduce(self) -> dict[int, list[Span]]:
        """The all-reduce records of every rank that has some, by rank, each by start."""
        for own in self.allreduce.values():
            own.sort(key=_T0)
        return dict(sorted(self.allreduce.items()))

    def spans_of(self, r: int) -> list[Span]:
        """Rank ``r``'s spans by start (a stable sort, its actions before its other records
        at a tie)."""
        out, t0, gap = [], self.start[r], self.gap
        for (kind, stage, microbatch, cat), t1 in zip(self.labels[r % self.pp], self.ends[r]):
            out.append(Span(r, kind, stage, microbatch, t0, t1, cat))
            t0 = t1 + gap
        out += self.extra[r]
        if r in self.allreduce:  # its steps were made among its actions
            out.sort(key=_T0)
        return out
