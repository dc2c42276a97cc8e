"""The engine's input for one placed schedule: the lowered schedule, per-stage compute times,
the bytes per message, the path between every pair of ranks that talk, and every rank's
data-parallel all-reduce steps. Built from a cell's plan (``testbed.plan``), never from
the experiment file.
"""
from __future__ import annotations

from testbed.topology import Slot
from testbed.schedule.ir import Schedule
from testbed.schedule.lower import lower
from testbed.sim.iteration import SimInput, StageTimes
from testbed.sim.paths import PathModel
from testbed.spec.allreduce import rank_steps


def collective_steps(slots: list[Slot], schedule: Schedule, grad_numel: list[int],
                     algorithm: str, bucket_numel: int | None) -> dict[int, dict[int, list]]:
    """Every rank's all-reduce steps per virtual stage (``grad_numel[stage]`` elements), as
    the workers run them (``testbed.spec.allreduce``); raises ValueError when the algorithm
    cannot run on this placement."""
    out: dict[int, dict[int, list]] = {}
    for slot in slots:
        out[slot.rank] = {s: rank_steps(slots, slot.rank, grad_numel[s], algorithm, bucket_numel)
                          for s in schedule.stages_of(slot.pp_rank)}
    return out


def build_input(paths: PathModel, slots: list[Slot], compute_schedule: Schedule,
                times: list[StageTimes], message_bytes: int, dp: int,
                collectives: dict[int, dict[int, list]], overlap: bool = True) -> SimInput:
    """The engine's input for a placed compute-only schedule (lowered here); paths between
    every two ranks (pipeline neighbours and replicas alike)."""
    schedule = lower(compute_schedule)
    pp = compute_schedule.pp
    rank_paths = {}
    for src in slots:
        for dst in slots:
            if src.rank != dst.rank and (src.dp_rank == dst.dp_rank or src.pp_rank == dst.pp_rank):
                rank_paths[(src.rank, dst.rank)] = paths.path(src, dst)
    return SimInput(schedule, times, message_bytes, dp, rank_paths, collectives, overlap)
