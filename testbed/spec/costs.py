"""The torch-free arithmetic of a workload's costs: parameters and FLOPs per stage, the
activation sent between stages, the bytes emulated tensors carry, the emulated compute times
and the DP all-reduce's chunks. The spec, the simulator and the workers all take them from
here, so a prediction and a run agree, and none of them needs torch to know a size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from testbed.spec.workload import ModelSpec, Workload

# Peak dense bf16 throughput of the device profiles (vendor data sheets), FLOP/s.
PEAK_FLOPS = {"a100": 312e12, "h100": 989e12}
# Emulated tensors are float32 (bfloat16 is modelled as half the elements).
FLOAT32_BYTES = 4


# ---------------------------------------------------------------- sizes


def layer_params(spec: ModelSpec) -> int:
    """Parameters of one block (attention 4h² + MLP 8h², biases and norms)."""
    h = spec.hidden
    return 12 * h * h + 13 * h


def stage_params(spec: ModelSpec, stage: int, n_stages: int) -> int:
    """Parameters held by a virtual stage (embeddings on the first, head on the last)."""
    n = layer_params(spec) * (spec.layers // n_stages)
    if stage == 0:
        n += (spec.vocab + spec.seq_len) * spec.hidden
    if stage == n_stages - 1:
        n += spec.vocab * spec.hidden + 2 * spec.hidden
    return n


def forward_flops(spec: ModelSpec, stage: int, n_stages: int, microbatch_size: int) -> float:
    """FLOPs of one stage's forward for one microbatch: 2 per parameter per token for the
    matrices, plus attention scores (2·s²·h per layer, twice)."""
    tokens = microbatch_size * spec.seq_len
    layers = spec.layers // n_stages
    flops = 2 * tokens * layer_params(spec) * layers
    flops += 4 * microbatch_size * spec.seq_len ** 2 * spec.hidden * layers
    if stage == n_stages - 1:
        flops += 2 * tokens * spec.vocab * spec.hidden
    return float(flops)


def activation_numel(spec: ModelSpec, microbatch_size: int, bytes_scale: float = 1.0) -> int:
    """Elements of the activation (and its gradient) between stages, scaled by
    ``bytes_scale`` (at least 1)."""
    return max(1, math.ceil(microbatch_size * spec.seq_len * spec.hidden * bytes_scale))


def bytes_factor(w: Workload) -> float:
    """The executor's: emulated tensors are float32 × bytes_scale (× 0.5 for bfloat16); real
    compute sends tensors as they are (1.0)."""
    c = w.compute
    if c.mode == "real":
        return 1.0
    return c.bytes_scale * (0.5 if c.dtype == "bfloat16" else 1.0)


def message_bytes(w: Workload) -> int:
    """Bytes of one activation (or its gradient) between stages, as the executor sends it."""
    return activation_numel(w.model, w.microbatch_size, bytes_factor(w)) * FLOAT32_BYTES


# ---------------------------------------------------------------- times


@dataclass
class ComputeTimes:
    """Emulated durations in seconds per virtual stage and microbatch."""

    f: float
    b: float
    w: float

    @property
    def i(self) -> float:
        return self.b - self.w

    @classmethod
    def from_workload(cls, w: Workload, stage: int, n_stages: int) -> "ComputeTimes":
        """From forward_ms/backward_ms/weight_ms, or from FLOPs on a device at an MFU (B = 2F,
        W = B/2); raises ValueError when neither is given."""
        c = w.compute
        if c.forward_ms is not None and c.backward_ms is not None:
            f, b = c.forward_ms / 1000, c.backward_ms / 1000
        elif c.device in PEAK_FLOPS:
            f = forward_flops(w.model, stage, n_stages, w.microbatch_size) / (
                PEAK_FLOPS[c.device] * c.mfu)
            b = 2 * f
        else:
            raise ValueError("emulated compute needs forward_ms and backward_ms, or a device "
                             f"with a known peak ({', '.join(PEAK_FLOPS)})")
        wt = c.weight_ms / 1000 if c.weight_ms is not None else b / 2
        return cls(f, b, wt)


def stage_forward_ms(w: Workload) -> float | None:
    """One stage's forward time per microbatch in ms, the TF of delays such as '2xTF':
    ``forward_ms``, or virtual stage 0's FLOPs / (peak × mfu) on the device; None when unknown."""
    c = w.compute
    if c.forward_ms is not None:
        return c.forward_ms
    if c.device not in PEAK_FLOPS:
        return None
    flops = forward_flops(w.model, 0, w.parallel.pp * w.chunks, w.microbatch_size)
    return flops / (PEAK_FLOPS[c.device] * c.mfu) * 1000


def stage_times(w: Workload) -> list[ComputeTimes] | None:
    """The emulated times of every virtual stage, or None when the workload gives neither
    times nor a device with a known peak (real compute without modelled times)."""
    n = w.parallel.pp * w.chunks
    try:
        return [ComputeTimes.from_workload(w, s, n) for s in range(n)]
    except ValueError:
        return None


def gradient_bytes(w: Workload, stages: list[int]) -> int:
    """Bytes of the gradients of ``stages`` (virtual stages of one pipeline rank), as the
    executor's data-parallel all-reduce moves them."""
    n = w.parallel.pp * w.chunks
    numel = sum(stage_params(w.model, s, n) for s in stages)
    return max(1, int(numel * bytes_factor(w))) * FLOAT32_BYTES


# ---------------------------------------------------------------- data-parallel all-reduce

# A GPU's rate of adding a received gradient chunk into its own during a ring all-reduce, in
# bytes of the chunk per second. The addition is memory-bound: it reads two chunks and writes
# one, so the rate is the memory bandwidth / 3; an A100 40GB's HBM2e moves 1.555 TB/s (data
# sheet). Emulated compute sleeps this time instead of adding (testbed/train/ring.py), and the
# simulator adds the same (testbed/sim/inputs.py). Like serialization, it scales with the bytes
# moved (bytes_scale).
GPU_REDUCE_BYTES_PER_S = 1.555e12 / 3


def ring_chunk_bytes(grad_bytes: int, dp: int) -> int:
    """Bytes one step of a ring all-reduce of ``grad_bytes`` over ``dp`` replicas moves to
    the next rank (grad_bytes / dp, rounded up to whole float32 elements)."""
    return math.ceil(grad_bytes / FLOAT32_BYTES / dp) * FLOAT32_BYTES


def reduce_step_s(chunk_bytes: int) -> float:
    """Modelled time (s) of one reduce-scatter step's addition of a ``chunk_bytes`` chunk."""
    return chunk_bytes / GPU_REDUCE_BYTES_PER_S
