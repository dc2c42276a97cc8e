"""What the cross-DC schedules are built from: the boundaries' delay and serialization, one
stage's compute times and a memory limit (``CrossDCContext``), shared by GeoPipe-style overlap
(``testbed.schedule.crossdc``), the greedy (``testbed.schedule.greedy``) and the MILP
(``testbed.schedule.milp``).

The greedy and the MILP work in integer microseconds (``to_us``): their comparisons of start
times are then exact, so serialization noise below half a microsecond (a few ns of an
unshaped 1 MiB message, or 8 ms arriving as 7.9999999996 ms) never flips a tie and never
changes a schedule.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from testbed.schedule.ir import Schedule

US_PER_MS = 1000


def to_us(ms: float) -> int:
    """Milliseconds to whole microseconds (rounded to nearest)."""
    return round(ms * US_PER_MS)


class ContextRequired(ValueError):
    """A cross-DC schedule was asked for without the link and compute times it is built from."""


@dataclass(frozen=True)
class Boundary:
    """The link between stage s and s + 1 (both directions alike): one-way propagation delay
    and the time one activation (or gradient) message occupies it (0 = unlimited rate), ms."""

    delay_ms: float = 0.0
    serialization_ms: float = 0.0

    @classmethod
    def from_link(cls, delay_ms: float, rate_mbit: float | None, message_bytes: int,
                  wire_overhead: float = 1514 / 1448) -> "Boundary":
        """A boundary from a link profile: serialization = bytes × 8 × overhead / rate."""
        ser = 0.0 if not rate_mbit else message_bytes * 8 * wire_overhead / (rate_mbit * 1e3)
        return cls(delay_ms, ser)


# A schedule's iteration time (any unit, only compared) by some simulator.
Evaluator = Callable[[Schedule], float]


@dataclass(frozen=True)
class CrossDCContext:
    """What a cross-DC schedule is built from.

    ``f_ms``, ``b_ms`` (full backward) and ``w_ms`` (its weight-gradient part, default B/2;
    I = B − W) are one stage's compute times per microbatch. ``boundaries[s]`` is the link
    after stage s; a missing s is an intra-DC link with no delay. ``memory_limit`` is the most
    microbatches of activations a stage may hold (an F allocates, the last backward action —
    B, or W when split — frees, as ``testbed.sim`` counts); ``None`` = no limit.
    ``evaluate`` (optional) times a candidate schedule; where a generator builds several
    candidates (``crosspipe_greedy``), it keeps the one ``evaluate`` finds shortest, and
    without it the one shortest in the generator's own model of these links.

    For a cell, ``testbed.plan.crossdc_context`` builds it from ``workload.compute``, the
    placement's path between consecutive stages (one-way delay, serialization of one
    activation) and ``workload.memory_limit``. Raises ValueError for non-positive times, W
    outside (0, B) or a memory limit below 1.
    """

    f_ms: float
    b_ms: float
    w_ms: float | None = None
    boundaries: dict[int, Boundary] = field(default_factory=dict)
    memory_limit: int | None = None
    evaluate: Evaluator | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.f_ms <= 0 or self.b_ms <= 0:
            raise ValueError(f"f_ms and b_ms must be > 0, got {self.f_ms}, {self.b_ms}")
        if self.w_ms is not None and not 0 < self.w_ms < self.b_ms:
            raise ValueError(f"w_ms={self.w_ms} must be in (0, b_ms={self.b_ms})")
        if self.memory_limit is not None and self.memory_limit < 1:
            raise ValueError(f"memory_limit must be ≥ 1 microbatch, got {self.memory_limit}")

    @property
    def w(self) -> float:
        return self.b_ms / 2 if self.w_ms is None else self.w_ms

    @property
    def i(self) -> float:
        return self.b_ms - self.w

    def boundary(self, s: int) -> Boundary:
        """The link after stage ``s`` (a zero boundary inside a DC)."""
        return self.boundaries.get(s, Boundary())

    def extra_inflight(self, s: int) -> int:
        """GeoPipe's k for stage s: ⌈2·delay / (F + B)⌉ summed over boundaries downstream."""
        return sum(math.ceil(2 * b.delay_ms / (self.f_ms + self.b_ms))
                   for t, b in self.boundaries.items() if t >= s)


def one_chunk(name: str, chunks: int) -> None:
    """Raises ValueError unless ``chunks`` is 1 (the cross-DC schedules' only layout)."""
    if chunks != 1:
        raise ValueError(f"{name} runs 1 chunk per rank, got {chunks}")
