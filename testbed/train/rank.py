"""Who a rank is, whichever executor runs it (``testbed.train.executor``, or
``testbed.train.torch_executor`` with torch's own schedules): its place in the pipeline and
data-parallel grid with its lowered schedule, and how long its emulated compute actions are
modelled to take (what they sleep and what the trace records as ``model_ns``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from testbed.schedule.ir import Kind, Schedule
from testbed.spec.costs import ComputeTimes

ns = time.monotonic_ns  # the clock of every trace record (CLOCK_MONOTONIC, ns)


@dataclass
class RankContext:
    """Who this rank is and who its pipeline peers are."""

    rank: int
    pp_rank: int
    dp_rank: int
    pp: int
    dp: int
    schedule: Schedule  # lowered

    def global_rank(self, stage: int) -> int:
        """The global rank owning virtual ``stage`` in this rank's DP replica."""
        return self.dp_rank * self.pp + self.schedule.stage_to_rank[stage]


def modelled_s(t: ComputeTimes, kind: Kind) -> float:
    """The modelled duration (s) of an emulated compute action of ``kind`` (F/B/I/W)."""
    return {Kind.F: t.f, Kind.B: t.b, Kind.I: t.i, Kind.W: t.w}[kind]


def modelled_ns(t: ComputeTimes, kind: Kind) -> int:
    """``modelled_s`` in integer ns, as the trace's ``model_ns`` field records it."""
    return round(modelled_s(t, kind) * 1e9)
