"""The engine's input for one placed schedule: the lowered schedule, per-stage compute times,
the bytes per message, the path between every pair of ranks that talk, and every rank's
data-parallel all-reduce steps. Built from a cell's plan (``testbed.plan``), never from
the experiment file.
"""
from __future__ import annotations

from testbed.topology import Slot
from testbed.schedule.ir import Schedule
from testbed.schedule.lower import lower
from testbed.sim.iteration import Path, SimInput, StageTimes
from testbed.sim.paths import PathModel
from testbed.sim.rings import CollectiveSteps


def collective_steps(slots: list[Slot], schedule: Schedule, grad_numel: list[int],
                     algorithm: str, bucket_numel: int | None) -> CollectiveSteps:
    """Every rank's all-reduce steps per virtual stage (``grad_numel[stage]`` elements), as
    the workers run them (``testbed.spec.allreduce``), made when first read; raises
    ValueError when the algorithm cannot run on this placement."""
    return CollectiveSteps(slots, schedule, grad_numel, algorithm, bucket_numel)


def build_input(paths: PathModel, slots: list[Slot], compute_schedule: Schedule,
                times: list[StageTimes], message_bytes: int, dp: int,
                collectives: dict[int, dict[int, list]], overlap: bool = True) -> SimInput:
    """The engine's input for a placed compute-only schedule (lowered here); the path between
    two ranks is computed when the engine first asks for it."""
    schedule = lower(compute_schedule)
    by_rank = {s.rank: s for s in slots}

    def path_of(src: int, dst: int) -> Path:
        return paths.path(by_rank[src], by_rank[dst])

    return SimInput(schedule, times, message_bytes, dp, {}, collectives, overlap,
                    path_of=path_of)
