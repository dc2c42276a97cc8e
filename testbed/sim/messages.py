"""The pipeline messages of one simulated iteration, by number.

A cell of thousands of ranks sends millions of messages. Each is a number, not a tuple: the
activations (F) or gradients (B) that a virtual stage sends for a microbatch, within its
data-parallel replica, and replica d's numbers follow replica d − 1's. What the engine
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
        self.per_replica = 2 * self.n_stages * self.m
        self.known = array("d", bytes(8 * dp * self.per_replica))
        self.arrival = array("d", [NOT_ARRIVED]) * (dp * self.per_replica)
        self.waiting: dict[int, tuple[int, float]] = {}

    def number(self, fwd: bool, stage: int, microbatch: int) -> int:
        """The number within its replica of what virtual ``stage`` sends for ``microbatch``:
        activations (``fwd``) or gradients. Raises ValueError outside the schedule's sizes."""
        if not (0 <= stage < self.n_stages and 0 <= microbatch < self.m):
            raise ValueError(f"stage {stage} microbatch {microbatch} is outside the "
                             f"schedule's {self.n_stages} stages and {self.m} microbatches")
        return ((0 if fwd else 1) * self.n_stages + stage) * self.m + microbatch

    def base(self, replica: int) -> int:
        """The first number of ``replica``'s messages."""
        return replica * self.per_replica

    def described(self, k: int) -> tuple:
        """Message ``k`` (a global number) as (replica, "F"/"B", sending stage, microbatch)."""
        replica, k = divmod(k, self.per_replica)
        way, k = divmod(k, self.n_stages * self.m)
        return (replica, "FB"[way]) + divmod(k, self.m)
