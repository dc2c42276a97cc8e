"""Cross-DC-aware schedule generators: they need to know the slow links, so they take a context.

- ``geopipe``: 1F1B whose warm-up admits extra in-flight microbatches on the ranks upstream of a
  DC boundary, enough to cover that boundary's round trip (k = ⌈2·delay / (F + B)⌉ each),
  capped by a memory limit, so compute goes on while activations and gradients cross the link.
- ``crosspipe_greedy``: a list scheduler over simulated time with split backward (I, W): each
  rank runs the ready action of highest priority I > F > W (CrossPipe's B > F > W, B being the
  input-gradient part), an F only while the memory limit allows; an input is ready once it has
  crossed its boundary (a FIFO per direction: serialization, then the one-way delay).
- ``crosspipe_milp``: the makespan-optimal schedule of the same model from a MILP solved by
  HiGHS (``scipy.optimize.milp``), for pp ≤ 4 and m ≤ 8.

All use one chunk per rank (stage r on rank r). The context is the one thing the standard
generators do not need; ``testbed.schedule.generators.generate`` passes it on to these only.
``testbed.plan.crossdc_context`` builds it from a cell once the placement is known; the runner
ships the resulting schedule to the workers in ``cell.json``.
"""
from __future__ import annotations

import heapq
import logging
import math
from dataclasses import dataclass, field
from typing import Callable

from testbed.schedule.ir import Action, Kind, Schedule
from testbed.schedule.registry import MILP_MAX_MICROBATCHES, MILP_MAX_PP

log = logging.getLogger(__name__)

MILP_TIME_LIMIT_S = 60.0


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


@dataclass(frozen=True)
class CrossDCContext:
    """What a cross-DC schedule is built from.

    ``f_ms``, ``b_ms`` (full backward) and ``w_ms`` (its weight-gradient part, default B/2;
    I = B − W) are one stage's compute times per microbatch. ``boundaries[s]`` is the link
    after stage s; a missing s is an intra-DC link with no delay. ``memory_limit`` is the most
    microbatches of activations a stage may hold (an F allocates, the last backward action —
    B, or W when split — frees, as ``testbed.sim`` counts); ``None`` = no limit.

    For a cell, ``testbed.plan.crossdc_context`` builds it from ``workload.compute``, the
    placement's path between consecutive stages (one-way delay, serialization of one
    activation) and ``workload.memory_limit``.
    """

    f_ms: float
    b_ms: float
    w_ms: float | None = None
    boundaries: dict[int, Boundary] = field(default_factory=dict)
    memory_limit: int | None = None

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


# ---------------------------------------------------------------- GeoPipe-style overlap

def geopipe(pp: int, m: int, chunks: int, ctx: CrossDCContext) -> Schedule:
    """1F1B with rank r's warm-up = min(pp−1−r + k_r, memory_limit − 1, m), k_r the extra
    microbatches covering the round trips of the boundaries downstream of r. Warm-ups never
    grow along the pipeline, so the order cannot deadlock. Raises ValueError for chunks ≠ 1."""
    _one_chunk("geopipe", chunks)
    cap = m if ctx.memory_limit is None else ctx.memory_limit - 1
    from testbed.schedule.generators import one_f_one_b_rank  # generators imports this module
    actions = [one_f_one_b_rank(r, max(0, min(pp - 1 - r + ctx.extra_inflight(r), cap, m)), m)
               for r in range(pp)]
    return Schedule("geopipe", pp, pp, m, list(range(pp)), actions)


def _one_chunk(name: str, chunks: int) -> None:
    if chunks != 1:
        raise ValueError(f"{name} runs 1 chunk per rank, got {chunks}")


# ---------------------------------------------------------------- CrossPipe greedy

_PRIORITY = {Kind.I: 0, Kind.F: 1, Kind.W: 2}


class _Links:
    """Per boundary and direction a FIFO: a transfer starts when the link is free, occupies it
    for its serialization time and arrives one delay later (ms)."""

    def __init__(self, ctx: CrossDCContext):
        self.ctx, self.free = ctx, {}

    def send(self, boundary: int, forward: bool, t: float) -> float:
        """Arrival time of a message handed to the link after stage ``boundary`` at ``t``."""
        b = self.ctx.boundary(boundary)
        start = max(t, self.free.get((boundary, forward), 0.0))
        self.free[(boundary, forward)] = start + b.serialization_ms
        return start + b.serialization_ms + b.delay_ms


class _Greedy:
    """The state of the list scheduler: per rank its free time, the arrival time of inputs
    (``ready``), and counters of F/I/W issued."""

    def __init__(self, pp: int, m: int, ctx: CrossDCContext):
        self.pp, self.m, self.ctx = pp, m, ctx
        self.free = [0.0] * pp
        self.ready: list[dict[tuple[Kind, int], float]] = [dict() for _ in range(pp)]
        self.done = [{Kind.F: 0, Kind.I: 0, Kind.W: 0} for _ in range(pp)]
        self.w_end: list[list[float]] = [[] for _ in range(pp)]
        self.links = _Links(ctx)
        self.order: list[list[Action]] = [[] for _ in range(pp)]
        for i in range(m):
            self.ready[0][(Kind.F, i)] = 0.0

    def _dur(self, kind: Kind) -> float:
        return {Kind.F: self.ctx.f_ms, Kind.I: self.ctx.i, Kind.W: self.ctx.w}[kind]

    def _candidates(self, r: int) -> list[tuple[float, int, Kind, int]]:
        """(earliest start, priority, kind, microbatch) of each rank-r action next in order."""
        out, d = [], self.done[r]
        for kind in (Kind.F, Kind.I, Kind.W):
            mb = d[kind]
            if mb >= self.m:
                continue
            t = self._ready_at(r, kind, mb)
            if t is not None:
                out.append((max(t, self.free[r]), _PRIORITY[kind], kind, mb))
        return out

    def _ready_at(self, r: int, kind: Kind, mb: int) -> float | None:
        if kind is Kind.W:
            return self.ready[r].get((Kind.W, mb))
        t = self.ready[r].get((kind, mb))
        limit = self.ctx.memory_limit
        if kind is Kind.F and t is not None and limit is not None and mb >= limit:
            frees = self.w_end[r]  # W of mb − limit must have ended before F of mb starts
            t = max(t, frees[mb - limit]) if len(frees) > mb - limit else None
        return t

    def step(self) -> bool:
        """Start the next action of the rank that can start earliest; False when all done."""
        best = None
        for r in range(self.pp):
            cands = self._candidates(r)
            if not cands:
                continue
            t = min(c[0] for c in cands)
            choice = min((c for c in cands if c[0] <= t), key=lambda c: c[1])
            if best is None or (t, r) < (best[0], best[1]):
                best = (t, r, choice[2], choice[3])
        if best is None:
            return False
        self._run(*best)
        return True

    def _run(self, t: float, r: int, kind: Kind, mb: int) -> None:
        end = t + self._dur(kind)
        self.free[r], self.done[r][kind] = end, self.done[r][kind] + 1
        self.order[r].append(Action(r, kind, mb))
        if kind is Kind.F:
            if r + 1 < self.pp:
                self.ready[r + 1][(Kind.F, mb)] = self.links.send(r, True, end)
            else:
                self.ready[r][(Kind.I, mb)] = end
        elif kind is Kind.I:
            self.ready[r][(Kind.W, mb)] = end
            if r > 0:
                self.ready[r - 1][(Kind.I, mb)] = self.links.send(r - 1, False, end)
        else:
            self.w_end[r].append(end)


def crosspipe_greedy(pp: int, m: int, chunks: int, ctx: CrossDCContext) -> Schedule:
    """CrossPipe-style greedy list schedule with split backward (see the module docstring).

    Among the actions a rank could start earliest, the one of highest priority I > F > W runs
    (microbatches in order within each kind). Raises ValueError for chunks ≠ 1."""
    _one_chunk("crosspipe_greedy", chunks)
    g = _Greedy(pp, m, ctx)
    while g.step():
        pass
    return Schedule("crosspipe_greedy", pp, pp, m, list(range(pp)), g.order)


def greedy_makespan_ms(pp: int, m: int, ctx: CrossDCContext) -> float:
    """The makespan (ms) of the greedy schedule in its own model (an upper bound for the MILP)."""
    g = _Greedy(pp, m, ctx)
    while g.step():
        pass
    return max(g.free)


# ---------------------------------------------------------------- CrossPipe MILP

class _Vars:
    """Column indices of the MILP: start of every (rank, kind, mb), the link transfers' starts,
    the ordering binaries, and the makespan."""

    def __init__(self) -> None:
        self.n, self.integer = 0, []

    def new(self, binary: bool = False) -> int:
        self.n += 1
        self.integer.append(1 if binary else 0)
        return self.n - 1


class _Model:
    """Rows of ``lo ≤ Σ coef·x ≤ hi`` built sparsely."""

    def __init__(self) -> None:
        self.rows: list[tuple[dict[int, float], float, float]] = []

    def geq(self, coefs: dict[int, float], lo: float) -> None:
        self.rows.append((coefs, lo, math.inf))


def _milp_precedences(pp: int, m: int, ctx: CrossDCContext, v: _Vars, mdl: _Model,
                      s: dict) -> None:
    """Dependencies, link FIFOs, in-order kinds and the memory limit (all as x_b − x_a ≥ c)."""
    dur = {Kind.F: ctx.f_ms, Kind.I: ctx.i, Kind.W: ctx.w}

    def after(b: int, a: int, gap: float) -> None:
        mdl.geq({b: 1.0, a: -1.0}, gap)

    for r in range(pp):
        for i in range(m):
            after(s[r, Kind.I, i], s[r, Kind.F, i], ctx.f_ms)
            after(s[r, Kind.W, i], s[r, Kind.I, i], ctx.i)
            if i:
                for k in (Kind.F, Kind.I, Kind.W):
                    after(s[r, k, i], s[r, k, i - 1], dur[k])
            if ctx.memory_limit is not None and i >= ctx.memory_limit:
                after(s[r, Kind.F, i], s[r, Kind.W, i - ctx.memory_limit], ctx.w)
    for r in range(pp - 1):
        b = ctx.boundary(r)
        for fwd, (src, dst, k) in ((True, (r, r + 1, Kind.F)), (False, (r + 1, r, Kind.I))):
            prev = None
            for i in range(m):
                x = v.new()
                after(x, s[src, k, i], dur[k])  # the transfer starts once produced
                if prev is not None:
                    after(x, prev, b.serialization_ms)  # one message at a time
                after(s[dst, k, i], x, b.serialization_ms + b.delay_ms)
                prev = x


def _milp_disjunctions(pp: int, m: int, ctx: CrossDCContext, v: _Vars, mdl: _Model,
                       s: dict, big: float) -> None:
    """One binary per pair of same-rank actions whose order the precedences leave open:
    F(i) vs I(j) and F(i) vs W(j) for i > j, I(i) vs W(j) for i > j."""
    dur = {Kind.F: ctx.f_ms, Kind.I: ctx.i, Kind.W: ctx.w}
    pairs = [(Kind.F, Kind.I), (Kind.F, Kind.W), (Kind.I, Kind.W)]
    for r in range(pp):
        for ka, kb in pairs:
            for i in range(m):
                for j in range(i):
                    a, b, y = s[r, ka, i], s[r, kb, j], v.new(binary=True)
                    # y = 1: a before b;  y = 0: b before a
                    mdl.geq({b: 1.0, a: -1.0, y: -big}, dur[ka] - big)
                    mdl.geq({a: 1.0, b: -1.0, y: big}, dur[kb])


def crosspipe_milp(pp: int, m: int, chunks: int, ctx: CrossDCContext) -> Schedule:
    """The makespan-optimal schedule (same model as ``crosspipe_greedy``: split backward, FIFO
    links, memory limit) from a MILP solved by HiGHS. Each kind runs its microbatches in order
    on each rank (FIFO links deliver them in that order). Raises ValueError when pp > 4 or
    m > 8 (use crosspipe_greedy), for chunks ≠ 1, or when the solver finds no solution within
    ``MILP_TIME_LIMIT_S``; a solution not proven optimal by then is returned with a warning."""
    _one_chunk("crosspipe_milp", chunks)
    if pp > MILP_MAX_PP or m > MILP_MAX_MICROBATCHES:
        raise ValueError(f"crosspipe_milp solves pp ≤ {MILP_MAX_PP} and microbatches ≤ "
                         f"{MILP_MAX_MICROBATCHES} only, got pp={pp}, m={m}; "
                         "use crosspipe_greedy for larger pipelines")
    starts = _solve_milp(pp, m, ctx)
    order = [sorted((Action(r, k, i) for k in (Kind.F, Kind.I, Kind.W) for i in range(m)),
                    key=lambda a: (starts[a.stage, a.kind, a.microbatch], _PRIORITY[a.kind]))
             for r in range(pp)]
    return Schedule("crosspipe_milp", pp, pp, m, list(range(pp)), order)


def _solve_milp(pp: int, m: int, ctx: CrossDCContext) -> dict[tuple[int, Kind, int], float]:
    """Start times (ms) of every action in an optimal (or best found) solution."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import lil_array

    big = greedy_makespan_ms(pp, m, ctx) + 1.0  # the greedy schedule is feasible: a bound
    v, mdl = _Vars(), _Model()
    s = {(r, k, i): v.new() for r in range(pp) for k in (Kind.F, Kind.I, Kind.W)
         for i in range(m)}
    cmax = v.new()
    _milp_precedences(pp, m, ctx, v, mdl, s)
    _milp_disjunctions(pp, m, ctx, v, mdl, s, big)
    for r in range(pp):
        mdl.geq({cmax: 1.0, s[r, Kind.W, m - 1]: -1.0}, ctx.w)
    a = lil_array((len(mdl.rows), v.n))
    for row, (coefs, _, _) in enumerate(mdl.rows):
        for col, c in coefs.items():
            a[row, col] = c
    cost = np.zeros(v.n)
    cost[cmax] = 1.0
    upper = np.where(np.array(v.integer) == 1, 1.0, big)
    res = milp(cost, integrality=np.array(v.integer),
               bounds=Bounds(np.zeros(v.n), upper),
               constraints=LinearConstraint(a.tocsr(), [lo for _, lo, _ in mdl.rows],
                                            [hi for _, _, hi in mdl.rows]),
               options={"time_limit": MILP_TIME_LIMIT_S})
    if res.x is None:
        raise ValueError(f"crosspipe_milp: HiGHS found no schedule ({res.message})")
    if res.status != 0:
        log.warning("crosspipe_milp: not proven optimal within %s s (%s); makespan %.3f ms",
                    MILP_TIME_LIMIT_S, res.message, res.x[cmax])
    return {key: float(res.x[col]) for key, col in s.items()}


CrossDCGenerator = Callable[[int, int, int, CrossDCContext], Schedule]

CROSS_DC_GENERATORS: dict[str, CrossDCGenerator] = {
    "geopipe": geopipe, "crosspipe_greedy": crosspipe_greedy, "crosspipe_milp": crosspipe_milp,
}


def generate_cross_dc(name: str, pp: int, m: int, chunks: int,
                      ctx: CrossDCContext | None) -> Schedule:
    """Run the cross-DC generator ``name``; raises ContextRequired when ``ctx`` is None."""
    if ctx is None:
        raise ContextRequired(
            f"{name} is a cross-DC schedule: it is built from the boundary delays, link rates, "
            "compute times and a memory limit; pass context=CrossDCContext(...) to generate "
            "(testbed.plan.crossdc_context builds it for a cell)")
    return CROSS_DC_GENERATORS[name](pp, m, chunks, ctx)
