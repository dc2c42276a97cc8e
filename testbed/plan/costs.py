"""The workload's modelled costs, as the planner needs them (torch-free)."""
from __future__ import annotations

from testbed.spec import Workload
from testbed.train.executor import ComputeTimes
from testbed.train.model import activation_numel, stage_params

FLOAT32_BYTES = 4


def times_known(w: Workload) -> bool:
    try:
        ComputeTimes.from_workload(w, 0, w.parallel.pp * w.chunks)
    except ValueError:
        return False
    return True


def stage_times(w: Workload) -> list[ComputeTimes]:
    n = w.parallel.pp * w.chunks
    return [ComputeTimes.from_workload(w, s, n) for s in range(n)]


def bytes_factor(w: Workload) -> float:
    c = w.compute
    if c.mode == "real":
        return 1.0
    return c.bytes_scale * (0.5 if c.dtype == "bfloat16" else 1.0)


def message_bytes(w: Workload) -> int:
    return activation_numel(w.model, w.microbatch_size, bytes_factor(w)) * FLOAT32_BYTES


def gradient_bytes(w: Workload, stages: list[int]) -> int:
    n = w.parallel.pp * w.chunks
    numel = sum(stage_params(w.model, s, n) for s in stages)
    return max(1, int(numel * bytes_factor(w))) * FLOAT32_BYTES
