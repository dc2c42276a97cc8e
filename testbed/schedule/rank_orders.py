"""Per-rank action orders shared by several generators (no generator imports another for them).

``one_f_one_b_rank`` is 1F1B's order on one rank with a chosen warm-up: the standard 1F1B
(``testbed.schedule.generators``) and GeoPipe-style overlap (``testbed.schedule.crossdc``) both
build on it.
"""
from __future__ import annotations

from testbed.schedule.ir import Action, Kind


def one_f_one_b_rank(stage: int, warm: int, microbatches: int) -> list[Action]:
    """One rank of a 1F1B-shaped schedule: ``warm`` forwards, one forward one backward, then
    the remaining backwards (GeoPipe-style schedules choose a larger ``warm``)."""
    acts = [Action(stage, Kind.F, i) for i in range(warm)]
    for i in range(microbatches - warm):
        acts += [Action(stage, Kind.F, warm + i), Action(stage, Kind.B, i)]
    return acts + [Action(stage, Kind.B, i) for i in range(microbatches - warm, microbatches)]
