"""``crosspipe_milp``: the makespan-optimal schedule of ``crosspipe_greedy``'s model (split
backward, a FIFO per boundary and direction, a memory limit) from a MILP solved by HiGHS
(``scipy.optimize.milp``), for pp ≤ 4 and m ≤ 8. The greedy's makespan bounds the big-M
constants; each rank's order is its actions sorted by their start times in whole
microseconds (ties: I, then F, then W), so solver noise below a microsecond cannot reorder it.
"""
from __future__ import annotations

import logging
import math

from testbed.schedule.context import CrossDCContext, one_chunk, to_us
from testbed.schedule.greedy import greedy_makespan_ms
from testbed.schedule.ir import Action, Kind, Schedule
from testbed.schedule.registry import MILP_MAX_MICROBATCHES, MILP_MAX_PP

log = logging.getLogger(__name__)

MILP_TIME_LIMIT_S = 60.0
_TIE_ORDER = {Kind.I: 0, Kind.F: 1, Kind.W: 2}  # among actions starting in the same µs


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
    one_chunk("crosspipe_milp", chunks)
    if pp > MILP_MAX_PP or m > MILP_MAX_MICROBATCHES:
        raise ValueError(f"crosspipe_milp solves pp ≤ {MILP_MAX_PP} and microbatches ≤ "
                         f"{MILP_MAX_MICROBATCHES} only, got pp={pp}, m={m}; "
                         "use crosspipe_greedy for larger pipelines")
    starts = _solve_milp(pp, m, ctx)
    order = [sorted((Action(r, k, i) for k in (Kind.F, Kind.I, Kind.W) for i in range(m)),
                    key=lambda a: (to_us(starts[a.stage, a.kind, a.microbatch]),
                                   _TIE_ORDER[a.kind]))
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
