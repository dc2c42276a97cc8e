"""Schedule generators: compute-only per-rank action lists (F, B; I/W for split schedules).

Implemented so far: ``gpipe`` and ``1f1b`` (one chunk per rank). The other names in
``testbed.schedule.registry.SCHEDULES`` raise NotImplementedError until their generators land.
"""
from __future__ import annotations

from typing import Callable

from testbed.schedule.ir import Action, Kind, Schedule
from testbed.schedule.registry import SCHEDULES

Generator = Callable[[int, int, int], Schedule]


def _gpipe(pp: int, microbatches: int, chunks: int) -> Schedule:
    """All forwards, then all backwards in microbatch order, on every rank."""
    actions = [[Action(r, Kind.F, i) for i in range(microbatches)]
               + [Action(r, Kind.B, i) for i in range(microbatches)] for r in range(pp)]
    return Schedule("gpipe", pp, pp, microbatches, list(range(pp)), actions)


def _one_f_one_b(pp: int, microbatches: int, chunks: int) -> Schedule:
    """PipeDream-Flush: rank r runs pp−1−r warm-up forwards, then alternates one forward and
    one backward, then drains the remaining backwards. Microbatches are numbered 0…m−1 on every
    rank (torch 2.13's exported order numbers the last rank 1…m; FACTS.md)."""
    actions = []
    for r in range(pp):
        warm = min(pp - 1 - r, microbatches)
        ranks = [Action(r, Kind.F, i) for i in range(warm)]
        for i in range(microbatches - warm):
            ranks += [Action(r, Kind.F, warm + i), Action(r, Kind.B, i)]
        ranks += [Action(r, Kind.B, i) for i in range(microbatches - warm, microbatches)]
        actions.append(ranks)
    return Schedule("1f1b", pp, pp, microbatches, list(range(pp)), actions)


GENERATORS: dict[str, Generator] = {"gpipe": _gpipe, "1f1b": _one_f_one_b}


def generate(name: str, pp: int, microbatches: int, chunks: int = 1) -> Schedule:
    """The compute-only schedule ``name`` for ``pp`` ranks and ``microbatches`` microbatches.

    Raises ValueError for an unknown name (listing the valid ones) and NotImplementedError for a
    registered schedule whose generator has not been written yet.
    """
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; valid: {', '.join(SCHEDULES)}")
    if name not in GENERATORS:
        raise NotImplementedError(f"no generator for {name!r} yet; available: "
                                  f"{', '.join(GENERATORS)}")
    return GENERATORS[name](pp, microbatches, chunks)
