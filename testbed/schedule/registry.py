"""Schedule names and the rules each one puts on pp, chunks and microbatches.

Pure data, importable without torch, so that ``validate`` stays fast and root-free.
Generators register themselves against these names in ``testbed.schedule.generators``.
"""
from __future__ import annotations

from dataclasses import dataclass

MILP_MAX_PP, MILP_MAX_MICROBATCHES = 4, 8  # crosspipe_milp's solvable size


@dataclass(frozen=True)
class ScheduleInfo:
    """What a schedule needs.

    chunks: virtual stages per rank it supports (``None`` = any ≥ 2);
    min_microbatches_per_pp: microbatches must be ≥ this × pp (0 = no rule);
    microbatches_multiple_of_pp: microbatches must be a multiple of pp.
    """

    name: str
    description: str
    chunks: tuple[int, ...] | None = (1,)
    min_microbatches_per_pp: int = 0
    min_microbatches_offset: int = 0  # need ≥ per_pp × pp + offset (zbv: 2·pp − 1)
    microbatches_multiple_of_pp: bool = False
    split_backward: bool = False  # uses I/W instead of B


SCHEDULES: dict[str, ScheduleInfo] = {
    s.name: s
    for s in [
        ScheduleInfo("gpipe", "all forwards, then all backwards (GPipe)"),
        ScheduleInfo("1f1b", "one forward one backward (PipeDream-Flush)", min_microbatches_per_pp=1),
        ScheduleInfo("interleaved_1f1b", "interleaved 1F1B over several chunks per rank (Megatron)",
                     chunks=None, min_microbatches_per_pp=1, microbatches_multiple_of_pp=True),
        ScheduleInfo("zb_h1", "zero-bubble H1: backward split into input (I) and weight (W) grads",
                     chunks=None, min_microbatches_per_pp=1, split_backward=True),
        ScheduleInfo("zbv", "zero-bubble V: two chunks per rank in a V shape", chunks=(2,),
                     min_microbatches_per_pp=2, min_microbatches_offset=-1, split_backward=True),
        ScheduleInfo("dualpipev", "DualPipeV: two chunks per rank, bidirectional", chunks=(2,),
                     min_microbatches_per_pp=2, split_backward=True),
    ]
}

# Built per cell from the placement's links and compute times (testbed.schedule.crossdc's
# CrossDCContext; testbed.plan builds it), with one chunk per rank and the IR executor.
CROSS_DC_SCHEDULES: dict[str, ScheduleInfo] = {
    s.name: s
    for s in [
        ScheduleInfo("geopipe", "1F1B with extra warm-up before DC boundaries (GeoPipe-style)"),
        ScheduleInfo("crosspipe_greedy", "latency/bandwidth-aware greedy, CrossPipe's selection "
                                          "rule or I > F > W, the shorter (CrossPipe)",
                     split_backward=True),
        ScheduleInfo("crosspipe_milp", "makespan-optimal MILP, pp ≤ 4, m ≤ 8 (CrossPipe)",
                     split_backward=True),
    ]
}


def schedule_problems(name: str, pp: int, chunks: int, microbatches: int) -> list[tuple[str, str]]:
    """Check a schedule's rules; returns (field, message) pairs, empty when all hold."""
    info = SCHEDULES.get(name) or CROSS_DC_SCHEDULES.get(name)
    if info is None:
        valid = ", ".join([*SCHEDULES, *CROSS_DC_SCHEDULES])
        return [("schedule", f"unknown schedule {name!r}; valid: {valid}")]
    if name == "crosspipe_milp" and (pp > MILP_MAX_PP or microbatches > MILP_MAX_MICROBATCHES):
        return [("schedule", f"crosspipe_milp is solved for pp ≤ {MILP_MAX_PP} and "
                             f"microbatches ≤ {MILP_MAX_MICROBATCHES} (got pp={pp}, "
                             f"microbatches={microbatches}); use crosspipe_greedy")]
    out: list[tuple[str, str]] = []
    if info.chunks is None and chunks < 2:
        out.append(("chunks", f"{name} needs chunks ≥ 2 virtual stages per rank, got {chunks}"))
    elif info.chunks is not None and chunks not in info.chunks:
        allowed = " or ".join(map(str, info.chunks))
        out.append(("chunks", f"{name} runs {allowed} chunk(s) per rank, got {chunks}"))
    need = info.min_microbatches_per_pp * pp + info.min_microbatches_offset
    if microbatches < need:
        offset = f" {info.min_microbatches_offset:+d}" if info.min_microbatches_offset else ""
        out.append(("microbatches", f"{name} needs microbatches ≥ {need} "
                                    f"({info.min_microbatches_per_pp} × pp={pp}{offset}), "
                                    f"got {microbatches}"))
    if info.microbatches_multiple_of_pp and microbatches % pp:
        out.append(("microbatches", f"{name} needs microbatches to be a multiple of pp={pp}, "
                                    f"got {microbatches}"))
    return out
