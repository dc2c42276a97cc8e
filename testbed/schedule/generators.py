"""Schedule generators: compute-only per-rank action lists (F, B; I/W for split schedules).

Each produces the per-rank compute order torch.distributed.pipelining 2.13 uses for the same
schedule (tests compare them), except 1F1B on the last rank, where torch's exported order is
wrong (docs/facts.md). Layouts: one chunk per rank → stage r on rank r; interleaved (v chunks)
→ stage s on rank s mod pp; V-shaped (zbv, dualpipev) → rank r holds stages r and 2·pp−1−r.
"""
from __future__ import annotations

from collections import defaultdict, deque
from typing import Callable

from testbed.schedule.crossdc import CROSS_DC_GENERATORS, CrossDCContext, generate_cross_dc
from testbed.schedule.ir import Action, Kind, Schedule
from testbed.schedule.rank_orders import one_f_one_b_rank
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
    rank (torch 2.13's exported order numbers the last rank 1…m; docs/facts.md)."""
    actions = [one_f_one_b_rank(r, min(pp - 1 - r, microbatches), microbatches)
               for r in range(pp)]
    return Schedule("1f1b", pp, pp, microbatches, list(range(pp)), actions)


class _RankOps:
    """One rank's action list under construction; numbers microbatches per (stage, kind)."""

    def __init__(self) -> None:
        self.actions: list[Action] = []
        self.count: dict[tuple[int, Kind], int] = defaultdict(int)
        self.pending_w: deque[tuple[int, int]] = deque()  # (stage, microbatch) awaiting W

    def add(self, stage: int, kind: Kind) -> int:
        """Append ``kind`` on ``stage`` for its next microbatch; returns that microbatch."""
        mb = self.count[(stage, kind)]
        self.count[(stage, kind)] = mb + 1
        self.actions.append(Action(stage, kind, mb))
        if kind is Kind.I:
            self.pending_w.append((stage, mb))
        return mb

    def weight(self) -> None:
        """Append the W of the oldest backward whose W is still to do (if any)."""
        if self.pending_w:
            stage, mb = self.pending_w.popleft()
            self.count[(stage, Kind.W)] += 1
            self.actions.append(Action(stage, Kind.W, mb))


def _rounds(pp: int, m: int) -> int:
    """Microbatches per round of an interleaved schedule (rounds = max(1, m // pp))."""
    return m // max(1, m // pp)


def _interleaved_order(pp: int, m: int, v: int, r: int, warm: int, split: bool) -> list[Action]:
    """Megatron's depth-first interleaving: forwards walk the chunks 0→v−1 and backwards
    v−1→0 in groups of one round of microbatches; ``warm`` forwards first, then one forward
    and one backward at a time, then the remaining backwards. With ``split`` (zero bubble) each
    backward is I, and the W of the oldest backward follows once rank r has done r steady
    pairs (its share of the pipeline's fill)."""
    g, total, ops = _rounds(pp, m), m * v, _RankOps()

    def fwd_stage(k: int) -> int:
        return ((k // g) % v) * pp + r

    def bwd_stage(k: int) -> int:
        return (v - 1 - ((k - warm) // g) % v) * pp + r

    back = Kind.I if split else Kind.B
    for k in range(warm):
        ops.add(fwd_stage(k), Kind.F)
    for k in range(warm, total + warm):
        if k < total:
            ops.add(fwd_stage(k), Kind.F)
        ops.add(bwd_stage(k), back)
        if split and k - warm >= r:
            ops.weight()
    while split and ops.pending_w:
        ops.weight()
    return ops.actions


def _interleaved_1f1b(pp: int, m: int, v: int) -> Schedule:
    acts = [_interleaved_order(pp, m, v, r, min((v - 1) * _rounds(pp, m) + 2 * (pp - 1 - r),
                                                m * v), split=False) for r in range(pp)]
    return Schedule("interleaved_1f1b", pp, pp * v, m, [s % pp for s in range(pp * v)], acts)


def _zb_h1(pp: int, m: int, v: int) -> Schedule:
    """Zero bubble H1 (torch's InterleavedZeroBubble): half the warm-up of interleaved 1F1B,
    backward split into I and W, W deferred to fill the drain."""
    acts = [_interleaved_order(pp, m, v, r, min((v - 1) * _rounds(pp, m) + (pp - 1 - r),
                                                m * v), split=True) for r in range(pp)]
    return Schedule("zb_h1", pp, pp * v, m, [s % pp for s in range(pp * v)], acts)


def v_stage_to_rank(pp: int) -> list[int]:
    """V layout: stage s < pp on rank s, stage s ≥ pp on rank 2·pp−1−s."""
    return [s if s < pp else 2 * pp - 1 - s for s in range(2 * pp)]


def _zbv_rank(pp: int, m: int, r: int) -> list[Action]:
    """ZB-V (Qi et al., section 6): chunk 0 is stage r, chunk 1 stage 2·pp−1−r."""
    c0, c1, ops = r, 2 * pp - 1 - r, _RankOps()
    F, I, W = Kind.F, Kind.I, Kind.W

    def fiw(stage: int, forward: bool = True) -> None:
        if forward:
            ops.add(stage, F)
        mb = ops.add(stage, I)
        ops.pending_w.pop()
        ops.actions.append(Action(stage, W, mb))
        ops.count[(stage, W)] += 1

    for _ in range(2 * (pp - r) - 1):
        ops.add(c0, F)
    for _ in range(r):
        ops.add(c1, F)
        ops.add(c0, F)
    for _ in range(pp - r):
        fiw(c1)
    while ops.count[(c1, F)] < ops.count[(c0, F)] or ops.count[(c0, F)] < m:
        if ops.count[(c0, F)] < m:
            ops.add(c0, F)
        fiw(c0, forward=False)
        fiw(c1)
    for _ in range(r):
        ops.add(c0, I)
        ops.add(c1, I)
    for _ in range(pp - r):
        ops.add(c0, I)
        _weight_of(ops, c0)
    while ops.count[(c1, W)] < ops.count[(c1, I)]:
        _weight_of(ops, c1)
    while ops.count[(c0, W)] < ops.count[(c0, I)]:
        _weight_of(ops, c0)
    return ops.actions


def _weight_of(ops: _RankOps, stage: int) -> None:
    """Append the next W of ``stage`` in microbatch order (dropping it from the pending queue)."""
    mb = ops.count[(stage, Kind.W)]
    ops.count[(stage, Kind.W)] = mb + 1
    ops.actions.append(Action(stage, Kind.W, mb))
    ops.pending_w = deque(p for p in ops.pending_w if p != (stage, mb))


def _zbv(pp: int, m: int, chunks: int) -> Schedule:
    if m < 2 * pp - 1:
        raise ValueError(f"zbv needs microbatches ≥ 2·pp−1 = {2 * pp - 1}, got {m}")
    return Schedule("zbv", pp, 2 * pp, m, v_stage_to_rank(pp),
                    [_zbv_rank(pp, m, r) for r in range(pp)])


def _dualpipev_rank(pp: int, m: int, r: int) -> list[Action]:
    """DualPipeV (DeepSeek's DualPipe folded into a V): overlapped F+B pairs in the middle,
    run here one after the other (F, then B); zero-bubble I/W splits in the drain."""
    c0, c1, ops = r, 2 * pp - 1 - r, _RankOps()
    F, B, I = Kind.F, Kind.B, Kind.I

    def full_b(stage: int) -> None:  # a full backward counts as both I and W for numbering
        mb = ops.count[(stage, I)]
        ops.count[(stage, I)] = mb + 1
        ops.count[(stage, Kind.W)] += 1
        ops.actions.append(Action(stage, B, mb))

    def overlap(f_stage: int, b_stage: int) -> None:
        ops.add(f_stage, F)
        full_b(b_stage)

    for _ in range(2 * (pp - r - 1)):
        ops.add(c0, F)
    for _ in range(r + 1):
        ops.add(c0, F)
        ops.add(c1, F)
    for _ in range(pp - r - 1):
        ops.add(c1, I)
        ops.weight()
        ops.add(c1, F)
    for i in range(m - 2 * pp + r + 1):
        if i == 0 and r == pp - 1:
            ops.add(c0, F)
            full_b(c1)
        else:
            overlap(c0, c1)
        overlap(c1, c0)
    for _ in range(pp - r - 1):
        full_b(c1)
        overlap(c1, c0)
    split = False
    for i in range(r + 1):
        split = split or (i == (r + 1) // 2 and r % 2 == 1)
        ops.add(c1, I) if split else full_b(c1)
        split = split or (i == (r + 1) // 2 and r % 2 == 0)
        ops.add(c0, I) if split else full_b(c0)
    for _ in range(pp - r - 1):
        ops.weight()
        ops.add(c0, I) if split else full_b(c0)
    for _ in range(r + 1):
        ops.weight()
    return ops.actions


def _dualpipev(pp: int, m: int, chunks: int) -> Schedule:
    if m < 2 * pp:
        raise ValueError(f"dualpipev needs microbatches ≥ 2·pp = {2 * pp}, got {m}")
    return Schedule("dualpipev", pp, 2 * pp, m, v_stage_to_rank(pp),
                    [_dualpipev_rank(pp, m, r) for r in range(pp)])


GENERATORS: dict[str, Generator] = {
    "gpipe": _gpipe, "1f1b": _one_f_one_b,
    "interleaved_1f1b": lambda pp, m, v: _interleaved_1f1b(pp, m, v),
    "zb_h1": lambda pp, m, v: _zb_h1(pp, m, v),
    "zbv": _zbv, "dualpipev": _dualpipev,
}


def generate(name: str, pp: int, microbatches: int, chunks: int = 1,
             context: CrossDCContext | None = None) -> Schedule:
    """The compute-only schedule ``name`` for ``pp`` ranks and ``microbatches`` microbatches.

    ``context`` (links, compute times, memory limit) is used by the cross-DC schedules only
    (``testbed.schedule.crossdc``), which raise ContextRequired (a ValueError) without it.
    Raises ValueError for an unknown name (listing the valid ones) and NotImplementedError for a
    registered schedule whose generator has not been written yet.
    """
    if name in CROSS_DC_GENERATORS:
        return generate_cross_dc(name, pp, microbatches, chunks, context)
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; valid: {', '.join(SCHEDULES)}")
    if name not in GENERATORS:
        raise NotImplementedError(f"no generator for {name!r} yet; available: "
                                  f"{', '.join(GENERATORS)}")
    return GENERATORS[name](pp, microbatches, chunks)
