"""The pipeline messages of one simulated iteration, by number.

A cell of thousands of ranks sends millions of messages. Each is a number, not a tuple: the
activations (F) that a virtual stage but the last, or the gradients (B) that a stage but the
first, sends for a microbatch within its data-parallel replica; replica d's numbers follow
replica d − 1's, so the arrays hold as many entries as the iteration has messages. What the engine
(``testbed.sim.engine``) keeps of each lives in flat arrays indexed by that number: when its
sender learns that its receive is posted, and when it arrives.
"""
from __future__ import annotations

from array import array

from testbed.schedule.ir import Schedule

NOT_ARRIVED = -1.0  # every arrival is later than the iteration's start (0)


class Messages:
    """``known[k]``: when message k's sender learns its receive is posted (0 without one);
    ``arrival[k]``: when it arrives (``NOT_ARRIVED`` before it is sent); ``waiting[k]``:
    (the rank blocked on its receive, since when)."""

    def __init__(self, schedule: Schedule, dp: int):
        self.n_stages, self.m = schedule.n_stages, schedule.microbatches
        self.per_replica = 2 * (self.n_stages - 1) * self.m
        self.known = array("d", bytes(8 * dp * self.per_replica))
        self.arrival = array("d", [NOT_ARRIVED]) * (dp * self.per_replica)
        self.waiting: dict[int, tuple[int, float]] = {}

    def number(self, fwd: bool, stage: int, microbatch: int) -> int:
        """The number within its replica of what virtual ``stage`` sends for ``microbatch``:
        activations (``fwd``) or gradients. Raises ValueError for a message no schedule of
        these sizes sends."""
        hop = stage if fwd else stage - 1  # the stage boundary it crosses
        if not (0 <= hop < self.n_stages - 1 and 0 <= microbatch < self.m):
            raise ValueError(f"stage {stage} sends no {'F' if fwd else 'B'} for microbatch "
                             f"{microbatch} in {self.n_stages} stages × {self.m} microbatches")
        return ((0 if fwd else 1) * (self.n_stages - 1) + hop) * self.m + microbatch

    def base(self, replica: int) -> int:
        """The first number of ``replica``'s messages."""
        return replica * self.per_replica

    def described(self, k: int) -> tuple:
        """Message ``k`` (a global number) as (replica, "F"/"B", sending stage, microbatch)."""
        replica, k = divmod(k, self.per_replica)
        way, k = divmod(k, (self.n_stages - 1) * self.m)
        hop, microbatch = divmod(k, self.m)
        return (replica, "FB"[way], hop + way, microbatch)
