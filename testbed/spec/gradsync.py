"""How a stage's data-parallel replicas synchronise: ``workload.gradient_sync``.

Three modes (docs/howto/low-communication.md):

- ``every_step``: the gradients are all-reduced in every iteration (``algorithm``, ``overlap``
  and ``bucket_mb`` say how);
- ``diloco``: every replica takes ``inner_steps`` (H) optimizer steps on its own; after the
  H-th, the pseudo-gradient (the parameters' change since the last outer step) is all-reduced
  across the replicas, sent as ``outer_dtype``, and the outer optimizer (Nesterov momentum)
  applies it. The iteration that ends with the all-reduce waits for it (a blocking sync);
- ``streaming``: the parameters are cut into ``fragments`` (F) equal pieces; fragment f is
  synchronised once every H steps, after step f·H/F of the window (its own slot), so the
  syncs are spread over the window. With ``overlap_steps: 1`` a fragment's all-reduce runs
  beside the next inner step and that step ends by waiting for what is left of it; with 0 it
  blocks like ``diloco``.

Iterations count from 0, warm-up included: iteration ``it`` ends inner step ``it + 1``. Every
outer all-reduce starts and ends within one iteration (the *sync step*), so an iteration's time
holds its sync's stall.
"""
from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from testbed.topology import Strict

SYNC_MODES = ("every_step", "diloco", "streaming")
# bytes one parameter's pseudo-gradient takes on the wire
OUTER_DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0, "int4": 0.5}
# where an outer all-reduce starts in its sync step: after the iteration's last action
# (blocking) or at the iteration's start, beside its pipeline work (overlap_steps: 1)
AFTER_LAST_ACTION, AT_START = "after_last_action", "at_start"
# before the first iteration the workers all-reduce every fragment this many times, untimed
# (testbed.train.outer.OuterSync.warm_up); the plan counts their bytes on the links
OUTER_WARM_UP_ROUNDS = 3


class GradientSync(Strict):
    """How a stage's data-parallel replicas all-reduce their gradients, or, in the
    low-communication modes, their pseudo-gradients."""

    mode: Literal["every_step", "diloco", "streaming"] = Field(
        "every_step", description="every_step: all-reduce the gradients in every iteration; "
                                  "diloco: inner_steps local steps, then a blocking all-reduce "
                                  "of the pseudo-gradient and an outer Nesterov step; "
                                  "streaming: the same per fragment, each in its own slot of "
                                  "the inner_steps, optionally overlapped with the next step "
                                  "(docs/howto/low-communication.md)")
    algorithm: Literal["ring", "hierarchical"] = Field(
        "ring", description="ring: one ring over every replica of the stage, ordered by DC "
                            "(file order) then replica, so it crosses each DC boundary once; "
                            "hierarchical: reduce-scatter inside each DC, all-reduce of the "
                            "shards between DCs, all-gather inside each DC (DCs holding "
                            "unequal numbers of replicas: the shards cut where any DC's shard "
                            "ends, each piece all-reduced between its owners)")
    overlap: bool = Field(
        True, description="every_step: start a stage's all-reduce as soon as its last backward "
                          "of the iteration ends, beside the rank's remaining pipeline work "
                          "(false: after the rank's last action)")
    bucket_mb: float | None = Field(
        None, gt=0, le=1_000_000,
        description="all-reduce a stage's gradients (diloco/streaming: its pseudo-gradient "
                    "fragment) in buckets of this many MB (10^6 bytes as sent, bytes_scale "
                    "applied), one after the other; None: one bucket")
    inner_steps: int = Field(10, ge=1, le=100_000,
                             description="diloco/streaming: local optimizer steps (H) per "
                                         "outer step of each parameter")
    outer_dtype: Literal["fp32", "bf16", "int8", "int4"] = Field(
        "fp32", description="diloco/streaming: the pseudo-gradient's type on the wire (4, 2, "
                            "1 or 0.5 bytes per parameter; int8 and int4 add one 4-byte "
                            "scale per chunk with real compute, which sums in fp32)")
    fragments: int = Field(1, ge=1, le=16,
                           description="streaming: parameter fragments (F), each synchronised "
                                       "in its own slot of the inner_steps (diloco: 1; at most "
                                       "16: each stage's fragments have their own message "
                                       "tags)")
    overlap_steps: int = Field(0, ge=0, le=1,
                               description="streaming: inner steps a fragment's all-reduce "
                                           "runs beside before the rank waits for it (0: "
                                           "blocking; 1: beside the next step)")
    outer_lr: float = Field(0.7, gt=0, le=10, description="outer Nesterov learning rate "
                                                           "(real compute)")
    outer_momentum: float = Field(0.9, ge=0, lt=1, description="outer Nesterov momentum "
                                                               "(real compute)")

    @model_validator(mode="after")
    def _mode_fields(self) -> "GradientSync":
        if self.mode == "diloco" and self.fragments != 1:
            raise ValueError("fragments applies to mode streaming (diloco syncs every "
                             "parameter at once): remove it or use mode: streaming")
        if self.mode == "diloco" and self.overlap_steps:
            raise ValueError("overlap_steps applies to mode streaming (diloco blocks): remove "
                             "it or use mode: streaming")
        if self.mode == "streaming" and self.fragments > self.inner_steps:
            raise ValueError(f"fragments={self.fragments} needs as many inner_steps, got "
                             f"{self.inner_steps}: each fragment syncs in its own step")
        return self

    @property
    def bucket_numel(self) -> int | None:
        """``bucket_mb`` as float32 elements (at least one); None: one bucket."""
        return None if self.bucket_mb is None else max(1, int(self.bucket_mb * 1e6
                                                                / OUTER_DTYPE_BYTES["fp32"]))

    @property
    def outer(self) -> bool:
        """Whether the replicas sync rarely (diloco, streaming) instead of every step."""
        return self.mode != "every_step"

    @property
    def outer_fragments(self) -> int:
        return self.fragments if self.mode == "streaming" else 1

    def sync_offset(self, fragment: int) -> int:
        """The inner step (1 … H) of each window after which ``fragment`` syncs: the last for
        diloco; for streaming, spread evenly, the last fragment at H."""
        return (fragment + 1) * self.inner_steps // self.outer_fragments

    def syncs_in(self, it: int) -> list[tuple[int, str]]:
        """The outer all-reduces iteration ``it`` runs: (fragment, AFTER_LAST_ACTION or
        AT_START); none in every_step mode."""
        if not self.outer:
            return []
        lag = self.overlap_steps if self.mode == "streaming" else 0
        step = it + 1 - lag  # the inner step whose parameters this iteration would sync
        if step < 1:
            return []
        where = AT_START if lag else AFTER_LAST_ACTION
        return [(f, where) for f in range(self.outer_fragments)
                if (step - self.sync_offset(f)) % self.inner_steps == 0]

    def fragment_numel(self, numel: int, fragment: int) -> tuple[int, int]:
        """(first element, elements) of ``fragment`` of a stage's ``numel`` parameters."""
        f = self.outer_fragments
        size = math.ceil(numel / f)
        start = min(numel, fragment * size)
        return start, min(numel, start + size) - start

    def wire_numel(self, numel: int, fragment: int) -> int:
        """float32 elements the emulated all-reduce moves for ``fragment`` of ``numel``
        parameters: its pseudo-gradient's bytes in ``outer_dtype``, at least one."""
        _, n = self.fragment_numel(numel, fragment)
        return max(1, math.ceil(n * OUTER_DTYPE_BYTES[self.outer_dtype] / 4))


def first_measured_sync(sync: GradientSync, warmup: int, iterations: int) -> int | None:
    """The first measured iteration holding an outer sync, None when none does."""
    return next((it for it in range(warmup, iterations) if sync.syncs_in(it)), None)
