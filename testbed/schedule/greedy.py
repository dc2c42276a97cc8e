"""``crosspipe_greedy``: a list scheduler over simulated time with split backward (I, W).

Each rank runs, of the actions it could start earliest (within ``TIE_WINDOW_MS``), the one
its selection rule puts first (microbatches in order within each kind); an F only while the
memory limit allows (the W of microbatch i − limit has ended); an input is ready once it has
crossed its boundary (a FIFO per boundary and direction: serialization, then the one-way
delay). Two rules:

- ``crosspipe``, CrossPipe's published rule: after an F prefer I > F > W (I is the
  input-gradient backward, CrossPipe's B); after an I (or a W), F > I > W; while the rank
  holds ``memory_limit`` microbatches (Fs issued − Ws issued), so that memory blocks the next F,
  W first (it frees memory); once every F has run, I > W.
- ``fixed``, the fixed priority I > F > W that testbed used before.

Neither wins everywhere (CrossPipe's is 40 ms shorter on p=4, m=8, F=I=W=20 ms, memory 4, one
boundary without delay; the fixed rule is shorter in 9 of the 50 four-DC configurations of
``experiments/crosspipe-sweep-4dc.yaml``), so ``crosspipe_greedy`` builds both and keeps the
shorter: timed by ``CrossDCContext.evaluate`` (testbed's simulator on the cell, when the
caller passes it) or else by the scheduler's own model of the context's links; a tie keeps
CrossPipe's. ``Schedule.variant`` names the rule that won. Times are whole microseconds
(``testbed.schedule.context.to_us``), so sub-µs noise in the inputs never flips a tie.
"""
from __future__ import annotations

from typing import Callable

from testbed.schedule.context import CrossDCContext, one_chunk, to_us
from testbed.schedule.ir import Action, Kind, Schedule

F, I, W = Kind.F, Kind.I, Kind.W

# (last kind the rank ran or None, every F has run, memory blocks the next F) → kinds, first
# preferred
Rule = Callable[[Kind | None, bool, bool], tuple[Kind, ...]]

# A rank waits up to this long (ms) for the action its rule prefers rather than start another
# one now: about one message's fixed software cost in the executor (testbed.sim.calibration:
# SEND_CALL_S + MESSAGE_LATENCY_S ≈ 0.55 ms), so an arrival a few µs after an exact tie — the
# serialization of a small message on an unshaped link — does not make a rank start a whole
# W first. Capped at a quarter of the shortest action for sub-ms compute times.
TIE_WINDOW_MS = 0.5

# a candidate must be shorter by more than this (s) to beat one listed earlier in RULES, so
# that a simulator's float noise does not decide between equal schedules
EVALUATE_TOLERANCE_S = 1e-6


def crosspipe_rule(last: Kind | None, forwards_done: bool, f_blocked: bool) -> tuple[Kind, ...]:
    """CrossPipe's ``node_priority``: alternate F and I, W when memory blocks an F."""
    if forwards_done:
        return (I, W)
    if f_blocked:
        return (W, I, F)
    return (I, F, W) if last is F else (F, I, W)


def fixed_rule(last: Kind | None, forwards_done: bool, f_blocked: bool) -> tuple[Kind, ...]:
    """testbed's earlier rule: I > F > W always."""
    return (I, F, W)


RULES: dict[str, Rule] = {"crosspipe": crosspipe_rule, "fixed": fixed_rule}


class _Links:
    """Per boundary and direction a FIFO: a transfer starts when the link is free, occupies it
    for its serialization time and arrives one delay later (µs)."""

    def __init__(self, ctx: CrossDCContext):
        self.ctx, self.free = ctx, {}

    def send(self, boundary: int, forward: bool, t: int) -> int:
        """Arrival time (µs) of a message handed to the link after stage ``boundary`` at ``t``."""
        b = self.ctx.boundary(boundary)
        ser = to_us(b.serialization_ms)
        start = max(t, self.free.get((boundary, forward), 0))
        self.free[(boundary, forward)] = start + ser
        return start + ser + to_us(b.delay_ms)


class _Greedy:
    """The state of the list scheduler: per rank its free time, the arrival time of inputs
    (``ready``), counters of F/I/W issued and the end times of its Ws (µs)."""

    def __init__(self, pp: int, m: int, ctx: CrossDCContext, rule: Rule):
        self.pp, self.m, self.limit, self.rule = pp, m, ctx.memory_limit, rule
        self.dur = {F: to_us(ctx.f_ms), I: to_us(ctx.i), W: to_us(ctx.w)}
        self.window = min(to_us(TIE_WINDOW_MS), min(self.dur.values()) // 4)
        self.free = [0] * pp
        self.ready: list[dict[tuple[Kind, int], int]] = [dict() for _ in range(pp)]
        self.done = [{F: 0, I: 0, W: 0} for _ in range(pp)]
        self.w_end: list[list[int]] = [[] for _ in range(pp)]
        self.last: list[Kind | None] = [None] * pp
        self.links = _Links(ctx)
        self.order: list[list[Action]] = [[] for _ in range(pp)]
        for i in range(m):
            self.ready[0][(F, i)] = 0

    def _forward_start(self, r: int) -> tuple[int | None, bool]:
        """(earliest start of rank r's next F or None, whether memory holds it back: the rank
        holds ``limit`` microbatches, Fs issued − Ws issued)."""
        mb = self.done[r][F]
        t = self.ready[r].get((F, mb))
        if self.limit is None or mb < self.limit:
            return t, False
        frees = self.w_end[r]  # W of mb − limit must have ended before F of mb starts
        if len(frees) <= mb - self.limit:
            return None, True
        return t, False  # that W ran on this rank, so it ended before the rank is free

    def choice(self, r: int) -> tuple[int, Kind] | None:
        """(start, kind) of the action rank r would run next, or None when it has none ready."""
        starts: dict[Kind, int] = {}
        blocked = False
        if self.done[r][F] < self.m:
            t, blocked = self._forward_start(r)
            if t is not None:
                starts[F] = max(t, self.free[r])
        for kind in (I, W):
            t = self.ready[r].get((kind, self.done[r][kind]))
            if t is not None:
                starts[kind] = max(t, self.free[r])
        if not starts:
            return None
        soon = min(starts.values()) + self.window
        order = self.rule(self.last[r], self.done[r][F] == self.m, blocked)
        kind = next(k for k in order if starts.get(k, soon + 1) <= soon)
        return starts[kind], kind

    def step(self) -> bool:
        """Start the next action of the rank whose choice starts earliest; False when all
        done."""
        best = None
        for r in range(self.pp):
            c = self.choice(r)
            if c is not None and (best is None or (c[0], r) < (best[0], best[1])):
                best = (c[0], r, c[1])
        if best is None:
            return False
        self._run(*best)
        return True

    def _run(self, t: int, r: int, kind: Kind) -> None:
        mb, end = self.done[r][kind], t + self.dur[kind]
        self.free[r], self.done[r][kind] = end, mb + 1
        self.order[r].append(Action(r, kind, mb))
        self.last[r] = kind
        if kind is F:
            if r + 1 < self.pp:
                self.ready[r + 1][(F, mb)] = self.links.send(r, True, end)
            else:
                self.ready[r][(I, mb)] = end
        elif kind is I:
            self.ready[r][(W, mb)] = end
            if r > 0:
                self.ready[r - 1][(I, mb)] = self.links.send(r - 1, False, end)
        else:
            self.w_end[r].append(end)

    def run(self) -> "_Greedy":
        while self.step():
            pass
        return self


def greedy_schedule(pp: int, m: int, ctx: CrossDCContext, rule: str) -> tuple[Schedule, int]:
    """The schedule of one selection rule (a key of ``RULES``) and its makespan in the
    scheduler's own model (µs). Raises KeyError for an unknown rule."""
    g = _Greedy(pp, m, ctx, RULES[rule]).run()
    s = Schedule("crosspipe_greedy", pp, pp, m, list(range(pp)), g.order, variant=rule)
    return s, max(g.free)


def crosspipe_greedy(pp: int, m: int, chunks: int, ctx: CrossDCContext) -> Schedule:
    """The shorter of the two rules' schedules (module docstring); ``variant`` says which.
    Raises ValueError for chunks ≠ 1."""
    one_chunk("crosspipe_greedy", chunks)
    best: tuple[float, Schedule] | None = None
    for rule in RULES:
        s, own_us = greedy_schedule(pp, m, ctx, rule)
        t = ctx.evaluate(s) if ctx.evaluate is not None else own_us / 1e6
        if best is None or t < best[0] - EVALUATE_TOLERANCE_S:
            best = (t, s)
    return best[1]


def greedy_makespan_ms(pp: int, m: int, ctx: CrossDCContext) -> float:
    """The shortest makespan (ms) of the rules' schedules in the scheduler's own model (an
    upper bound for the MILP)."""
    return min(greedy_schedule(pp, m, ctx, rule)[1] for rule in RULES) / 1000
