"""The engine's input for one placed schedule: the lowered schedule, per-stage compute times,
the bytes per message, the path between every pair of ranks that talk, and each pipeline
rank's data-parallel all-reduce time. Built from a cell's plan (``testbed.plan``), never from
the experiment file.
"""
from __future__ import annotations

from testbed.topology import Slot
from testbed.schedule.ir import Schedule
from testbed.schedule.lower import lower
from testbed.sim import calibration as C
from testbed.sim.iteration import SimInput, StageTimes
from testbed.sim.paths import PathModel
from testbed.spec.costs import reduce_step_s, ring_chunk_bytes


def allreduce_s(paths: PathModel, slots: list[Slot], pp: int, dp: int,
                grad_bytes: list[int]) -> list[float]:
    """Ring all-reduce time (s) of each pipeline rank's ``grad_bytes`` over its dp replicas:
    2(d−1) steps, each moving 1/d of the gradients over the slowest edge of the ring, and
    after each of the first d−1 the addition of the received chunk (``reduce_step_s``, which
    emulated compute sleeps: testbed/train/ring.py)."""
    if dp == 1:
        return [0.0] * pp
    out = []
    for p in range(pp):
        chunk = ring_chunk_bytes(grad_bytes[p], dp)
        ring = [slots[i * pp + p] for i in range(dp)]
        step = max(paths.path(a, b).serialization_s(chunk) + paths.path(a, b).delay_s
                   + C.MESSAGE_LATENCY_S for a, b in zip(ring, ring[1:] + ring[:1]))
        reduce = reduce_step_s(chunk) + C.SLEEP_OVERSHOOT_S
        out.append(2 * (dp - 1) * step + (dp - 1) * reduce)
    return out


def build_input(paths: PathModel, slots: list[Slot], compute_schedule: Schedule,
                times: list[StageTimes], message_bytes: int, dp: int,
                allreduce: list[float]) -> SimInput:
    """The engine's input for a placed compute-only schedule (lowered here)."""
    schedule = lower(compute_schedule)
    pp = compute_schedule.pp
    rank_paths = {}
    for d in range(dp):
        for a in range(pp):
            for b in range(pp):
                if a != b:
                    src, dst = slots[d * pp + a], slots[d * pp + b]
                    rank_paths[(src.rank, dst.rank)] = paths.path(src, dst)
    return SimInput(schedule, times, message_bytes, dp, rank_paths, allreduce)
