"""Every rank's all-reduce steps, made when asked for, and the fast path for rings that nothing
else touches.

A cell of thousands of ranks has millions of ring steps (2 (k − 1) per rank and bucket for k
replicas). ``CollectiveSteps`` holds how to make them: the same steps ``rank_steps`` gives
(``testbed.spec.allreduce``, what the workers run), one rank at a time, when a reader asks.

``ring_times`` times a whole ring at once, one vector operation per step over its ranks, when
its transfers share nothing with any other transfer: no shaped hop on any of its paths and
one all-reducing stage per rank (its connection carries only its own steps, one after the
other). Then no transfer waits for anything but its own ring, and the event model of
``testbed.sim.collective`` reduces to the recurrence below, computed with the same
operations in the same order: the same floats.

Step i of the rank at position j (sending to j + 1, receiving from j − 1), posted at P[j]:
its bytes leave at L[j] = max(P[j], P[j + 1] + delay(j + 1 → j)) + serialization(j → j + 1)
(gloo sends once the receiver's post is known), arrive at L[j] + delay(j → j + 1) + the
message latency, and the step is done, the next one posted, at max(L[j], arrival from j − 1),
plus the reduction's modelled time on a reduce-scatter step.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from testbed.schedule.ir import Schedule
from testbed.sim import calibration as C
from testbed.sim.iteration import Path
from testbed.spec.allreduce import Step, bucket_sizes, group_steps, padded, replica_groups
from testbed.spec.costs import FLOAT32_BYTES, reduce_step_s
from testbed.topology import Slot


@dataclass(frozen=True)
class Ring:
    """One stage's all-reduce as a single ring: the global ranks in ring order and the
    elements each step moves, per bucket (reduce-scatter then all-gather, k − 1 steps each)."""

    ranks: tuple[int, ...]
    chunk_numel: tuple[int, ...]


class CollectiveSteps(Mapping):
    """``steps[rank][stage]``: the ring steps of ``rank``'s all-reduce of virtual ``stage``
    (``testbed.spec.allreduce.rank_steps``), made on first use; ``ring(stage, rank)`` the
    whole ring when the algorithm is ``ring``. Raises ValueError when the algorithm cannot
    run on this placement."""

    def __init__(self, slots: list[Slot], schedule: Schedule, grad_numel: list[int],
                 algorithm: str, bucket_numel: int | None):
        self.schedule, self.grad_numel = schedule, grad_numel
        self.algorithm, self.bucket_numel = algorithm, bucket_numel
        self.pp_rank = {s.rank: s.pp_rank for s in slots}
        self.groups = {p: replica_groups(slots, p) for p in sorted(set(self.pp_rank.values()))}
        if algorithm not in ("ring", "hierarchical"):
            raise ValueError(f"unknown gradient_sync algorithm {algorithm!r}; valid: ring, "
                             "hierarchical")
        self._made: dict[int, dict[int, list[Step]]] = {}
        self._rings: dict[tuple[int, int], Ring | None] = {}

    def __getitem__(self, rank: int) -> dict[int, list[Step]]:
        if rank not in self._made:
            if rank not in self.pp_rank:
                raise KeyError(rank)
            groups = self.groups[self.pp_rank[rank]]
            self._made[rank] = {s: group_steps(groups, rank, self.grad_numel[s], self.algorithm,
                                               self.bucket_numel)
                                for s in self.schedule.stages_of(self.pp_rank[rank])}
        return self._made[rank]

    def __iter__(self) -> Iterator[int]:
        return iter(self.pp_rank)

    def __len__(self) -> int:
        return len(self.pp_rank)

    def stages_of(self, rank: int) -> list[int]:
        """The virtual stages ``rank`` all-reduces (none without replicas)."""
        p = self.pp_rank.get(rank)
        if p is None or sum(map(len, self.groups[p])) < 2:  # both algorithms: one replica
            return []
        return list(self.schedule.stages_of(p))

    def ring(self, stage: int, rank: int) -> Ring | None:
        """``rank``'s all-reduce of ``stage`` as one ring (algorithm ``ring``), else None."""
        p = self.pp_rank[rank]
        if (stage, p) not in self._rings:
            found = None
            if self.algorithm == "ring" and stage in self.stages_of(rank):
                ranks = [r for g in self.groups[p] for r in g]
                found = Ring(tuple(ranks), tuple(padded(n, [ranks]) // len(ranks) for n in
                                                 bucket_sizes(self.grad_numel[stage],
                                                              self.bucket_numel)))
            self._rings[(stage, p)] = found
        return self._rings[(stage, p)]


@dataclass(frozen=True)
class RingTimes:
    """Per rank of a timed ring (ring order): when its first step was posted, when its last
    bytes left and when its last step was done."""

    first_posted: np.ndarray
    last_left: np.ndarray
    done: np.ndarray


def ring_times(ring: Ring, starts: list[float], forward: list[Path],
               backward: list[Path]) -> RingTimes:
    """Time ``ring`` from each rank's start (ring order); ``forward[j]`` is the path from
    position j to j + 1, ``backward[j]`` from j + 1 to j. Only for rings whose transfers share
    nothing (see the module's docstring)."""
    posted = np.array(starts, dtype=float)
    first = posted.copy()
    d_fwd = np.array([p.delay_s for p in forward])
    d_back = np.array([p.delay_s for p in backward])
    left = posted
    k = len(ring.ranks)
    for numel in ring.chunk_numel:
        nbytes = numel * FLOAT32_BYTES
        ser = np.array([p.serialization_s(nbytes) for p in forward])
        reduce_extra = reduce_step_s(nbytes) + C.SLEEP_OVERSHOOT_S
        for reduce in (True, False):
            for _ in range(k - 1):
                left = np.maximum(posted, np.roll(posted, -1) + d_back) + ser
                done = np.maximum(left, np.roll(left + d_fwd + C.MESSAGE_LATENCY_S, 1))
                posted = done + reduce_extra if reduce else done
    return RingTimes(first, left, posted)
