"""The discrete-event engine: every rank runs its lowered action list in order, in simulated time.

Model, per iteration (all ranks start together, as after the executor's barrier):

- each rank first posts one receive per RECV in its list (``POST_RECV_S`` each); gloo tells
  the sender of each posted receive (a notification over the reverse path), and sends the
  bytes of a message only once the sender knows its receive is posted: a message issued before
  that waits for it. With a one-way delay longer than the compute before a rank's first send
  (say 40 ms against a 20 ms forward), that first message leaves one delay after the
  iteration's start, not when it was issued;
- a compute action (F, B, I, W) takes its emulated time plus ``SLEEP_OVERSHOOT_S``; it counts
  as busy, exactly as the executor's trace does;
- a SEND holds its rank ``SEND_CALL_S`` (idle, as the trace's ``comm`` record) and hands the
  message to its path. Every shaped hop of the path is a FIFO per direction: one transfer at a
  time, in the order the sends were issued (htb + bfifo, and gloo's one TCP connection per rank
  pair, serve bytes in order; concurrent TCP flows on one link could interleave packets and
  share the rate instead: measured on this emulator with a queue that holds the bursts, two
  replicas' simultaneous activations went one after the other, docs/howto/data-parallel.md).
  The data-parallel all-reduce's chunks queue on the same FIFOs in quanta
  (``testbed.sim.collective``). ``workload.wan_sharing: temporal`` staggers the replicas'
  starts (``start_offsets``, ``testbed.plan.sharing``). A transfer starts when every hop of its
  path is free and its receive is known to be posted, occupies them for bytes × 8 / the
  bottleneck rate, and arrives one propagation delay (the sum over hops) and
  ``MESSAGE_LATENCY_S`` of software later. Unshaped paths move ``UNSHAPED_BYTES_PER_S``;
- a RECV blocks until its message has arrived; the blocked time is exposed communication;
- after its last action a rank waits for its sends to leave (SEND_WAIT), then, with dp > 1,
  for its stages' data-parallel all-reduces (ALLREDUCE_WAIT, exposed communication). A
  stage's all-reduce starts when its last backward (B or W) ends (``overlap``, as the
  executor does), after the SEND_WAIT, or with the iteration (``at_start``: an outer sync
  overlapped with an inner step); its ring steps are transfers on the same hops as the
  pipeline's (``testbed.sim.collective``).

Not modelled: TCP slow start and congestion control, packet loss and retransmission, jitter,
time-varying link steps, CPU contention between ranks, barrier skew.
"""
from __future__ import annotations

import heapq
from collections import defaultdict
from operator import attrgetter

from testbed.schedule.ir import Action, Kind, Schedule
from testbed.sim import calibration as C
from testbed.sim.collective import Collectives

_tuple_new = tuple.__new__
from testbed.sim.iteration import (Deadlock, Path, SimInput, SimResult, Span,
                                   TransferRequest, duration)


class _Run:
    """The state of one simulated iteration; ``go`` runs it."""

    def __init__(self, inp: SimInput):
        self.inp, self.s = inp, inp.schedule
        self.pp = self.s.pp
        self.world = inp.dp * self.s.pp
        self.pos = [0] * self.world
        self.events: list[tuple[float, int, int]] = []
        self.seq = 0
        self.arrival: dict[tuple, float] = {}
        self.recv_known: dict[tuple, float] = {}  # when the sender learns the recv is posted
        self.waiting: dict[tuple, tuple[int, float]] = {}
        self.hop_free: dict[str, float] = defaultdict(float)
        self.sent_by: dict[int, float] = defaultdict(float)
        self.spans: list[Span] = []
        self.done: dict[int, float] = {}
        self.memory = _Memory(self.s, self.world)
        self.collectives = Collectives(inp, self.push, self.hop_free, self.spans)
        # (src, dst) → the path and the hops its messages occupy (the pair's connection last)
        self.conn: dict[tuple[int, int], tuple[Path, tuple[str, ...]]] = {}
        self.start_ar = inp.overlap and not inp.at_start  # all-reduces at the last backward
        self.compiled = [self._compile(p) for p in range(self.s.pp)]
        self.step_fn = self._step  # one bound method for every step event
        self.gap = C.ACTION_GAP_S

    def _compile(self, p: int) -> list[tuple]:
        """Pipeline rank ``p``'s actions with what ``_step`` needs of each, worked out once:
        (action, its kind's name, compute time or None, activations held +1/−1/0, whether
        its stage's gradients are complete after it, the message it sends or waits for as
        (direction, sending stage, microbatch), the peer's pipeline rank)."""
        acts = self.s.actions[p]
        last_grad = {a.stage: i for i, a in enumerate(acts) if a.kind in (Kind.B, Kind.W)}
        out = []
        for i, a in enumerate(acts):
            fwd = a.kind in (Kind.SEND_F, Kind.RECV_F)
            if a.kind.is_compute:
                dur = duration(self.inp.times[a.stage], a.kind) + C.SLEEP_OVERSHOOT_S
                out.append((a, a.kind.value, dur, self.memory.delta(a), last_grad.get(a.stage) == i,
                            None, None))
            elif a.kind in (Kind.SEND_F, Kind.SEND_B):
                peer = self.s.stage_to_rank[a.stage + 1 if fwd else a.stage - 1]
                out.append((a, a.kind.value, None, 0, False,
                            ("F" if fwd else "B", a.stage, a.microbatch), peer))
            else:
                out.append((a, a.kind.value, None, 0, False,
                            ("F" if fwd else "B", a.stage - 1 if fwd else a.stage + 1,
                             a.microbatch), None))
        return out

    def push(self, t: float, fn, *args) -> None:
        """Call ``fn(t, *args)`` at simulated time ``t`` (ties in the order pushed)."""
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, fn, args))

    def go(self) -> SimResult:
        for r in range(self.world):
            self.push(self._post_receives(r), self._step, r)
            if self.inp.at_start:
                for stage in self.collectives.stages_of(r):
                    self.collectives.start(self.inp.start_offsets.get(r, 0.0), stage, r)
        events, pop = self.events, heapq.heappop
        while events:
            t, _, fn, args = pop(events)
            fn(t, *args)
        if len(self.done) < self.world:
            stuck = {r: str(self._actions(r)[self.pos[r]]) for r in range(self.world)
                     if r not in self.done}
            raise Deadlock(f"deadlock: ranks wait on {stuck}")
        self.collectives.finish()
        return self._result(self._all_reduce())

    def _post_receives(self, r: int) -> float:
        """Post rank ``r``'s receives in list order and record when each sender learns of its
        receive. Returns the time the rank's first action starts."""
        t = self.inp.start_offsets.get(r, 0.0)
        post, replica, delay = C.POST_RECV_S, (r // self.pp,), {}
        for *_, message, peer in self.compiled[r % self.pp]:
            if message is not None and peer is None:  # a receive
                t += post
                stage = message[1]
                if stage not in delay:
                    delay[stage] = self.inp.path(r, self._global(r, stage)).delay_s
                self.recv_known[replica + message] = t + delay[stage]
        return t

    def _actions(self, rank: int) -> list[Action]:
        return self.s.actions[rank % self.s.pp]

    def _global(self, rank: int, stage: int) -> int:
        return (rank // self.s.pp) * self.s.pp + self.s.stage_to_rank[stage]

    def _step(self, t: float, r: int) -> None:
        acts = self.compiled[r % self.pp]
        i = self.pos[r]
        if i == len(acts):
            end = max(t, self.sent_by[r])
            self.spans.append(Span(r, "SEND_WAIT", None, None, t, end, "wait"))
            self.done[r] = end
            if not self.inp.overlap and not self.inp.at_start:
                for stage in self.collectives.stages_of(r):
                    self.collectives.start(end, stage, r)
            return
        a, kind, dur, held, grads_done, message, peer = acts[i]
        if dur is not None:
            t1 = t + dur
            self._advance(r, a, kind, t, t1, "compute")
            if held:
                self.memory.events.append((t1, held, r, a.stage))
            if grads_done and self.start_ar:
                self.collectives.start(t1, a.stage, r)
        elif peer is not None:
            self._send(r, t, (r // self.pp,) + message, peer)
            self._advance(r, a, kind, t, t + C.SEND_CALL_S, "comm")
        else:
            self._recv(r, a, kind, t, (r // self.pp,) + message)

    def _advance(self, r: int, a: Action, kind: str, t0: float, t1: float, cat: str) -> None:
        # Span(...) without its Python-level __new__: the same tuple, made in C
        self.spans.append(_tuple_new(Span, (r, kind, a.stage, a.microbatch, t0, t1, cat)))
        self.pos[r] += 1
        self.seq += 1  # self.push(t1 + C.ACTION_GAP_S, self._step, r), without the call
        heapq.heappush(self.events, (t1 + self.gap, self.seq, self.step_fn, (r,)))

    def _send(self, r: int, t: float, key: tuple, peer: int) -> None:
        """Rank ``r`` sends message ``key`` (replica, direction, stage, microbatch) to the
        pipeline rank ``peer`` of its replica."""
        dst = key[0] * self.s.pp + peer
        conn = self.conn.get((r, dst))
        if conn is None:
            path = self.inp.path(r, dst)
            conn = self.conn[(r, dst)] = (path, path.hops + (f"conn {r}->{dst}",))
        path, hops = conn
        start = max(t, self.recv_known.pop(key, 0.0))  # each message is sent once
        hop_free = self.hop_free
        for h in hops:
            if hop_free[h] > start:
                start = hop_free[h]
        if self.inp.transfer is not None:  # a per-transfer allocation (testbed.optical)
            start, path = self.inp.transfer(TransferRequest(r, dst, key, t, start,
                                                            self.inp.message_bytes))
        left = start + path.serialization_s(self.inp.message_bytes)
        for h in hops:
            hop_free[h] = left
        if left > self.sent_by[r]:
            self.sent_by[r] = left
        self.arrival[key] = left + path.delay_s + C.MESSAGE_LATENCY_S
        if key in self.waiting:
            self.push(*self._wake(key))

    def _wake(self, key: tuple) -> tuple:
        rank, since = self.waiting.pop(key)
        return since, self._step, rank

    def _recv(self, r: int, a: Action, kind: str, t: float, key: tuple) -> None:
        if key not in self.arrival:
            self.waiting[key] = (r, t)  # woken (at t) once the send is issued
            return
        arrived = self.arrival.pop(key)  # each message is received once
        self._advance(r, a, kind, t, arrived if arrived > t else t, "wait")

    def _all_reduce(self) -> dict[int, float]:
        """Each rank's end: after its sends left and its all-reduces ended (the wait for them
        is an ALLREDUCE_WAIT span, exposed communication as in the executor's trace)."""
        ends = {}
        for r, done in self.done.items():
            end = self.collectives.end_of(r)
            if end is None:
                raise Deadlock(f"deadlock: rank {r}'s all-reduce never ends")
            ends[r] = max(done, end)
            if self.collectives.stages_of(r):
                self.spans.append(Span(r, "ALLREDUCE_WAIT", None, None, done, ends[r], "wait"))
        return ends

    def _result(self, ends: dict[int, float]) -> SimResult:
        busy, wait = [0.0] * self.world, [0.0] * self.world
        # by rank, then start: each rank's spans were made nearly in order, so sorting them
        # rank by rank is the stable sort by (rank, t0) at a fraction of its cost
        by_rank: list[list[Span]] = [[] for _ in range(self.world)]
        for sp in self.spans:
            r, _, _, _, t0, t1, cat = sp
            if cat == "compute":
                busy[r] += t1 - t0
            elif cat == "wait":
                wait[r] += t1 - t0
            by_rank[r].append(sp)
        spans = [sp for own in by_rank for sp in sorted(own, key=attrgetter("t0"))]
        return SimResult(spans, max(ends.values()), busy, wait, self.memory.peak_per_stage(),
                         self.memory.peak_per_rank())


class _Memory:
    """Activations held per (rank, virtual stage): one per microbatch from the end of its F to
    the end of its last backward action (W when the schedule splits the backward, else B)."""

    def __init__(self, s: Schedule, world: int):
        self.n_stages, self.pp, self.world = s.n_stages, s.pp, world
        self.release = {(a.stage, a.microbatch): a.kind for acts in s.actions for a in acts
                        if a.kind in (Kind.B, Kind.W)}
        self.events: list[tuple[float, int, int, int]] = []  # (t, +1/-1, rank, stage)
        self._found: tuple[dict, dict] | None = None

    def delta(self, a: Action) -> int:
        """+1 when ``a`` holds a microbatch's activations from its end, −1 when it frees them."""
        if a.kind is Kind.F:
            return 1
        return -1 if self.release.get((a.stage, a.microbatch)) is a.kind else 0

    def _peaks(self) -> tuple[dict, dict]:
        """The most held at once per (rank, stage) and per rank."""
        if self._found is None:
            live: dict = defaultdict(int)
            peak: dict = defaultdict(int)
            for _, delta, rank, stage in sorted(self.events):  # frees before allocations at a tie
                for k in ((rank, stage), rank):
                    live[k] += delta
                    peak[k] = max(peak[k], live[k])
            self._found = ({k: v for k, v in peak.items() if isinstance(k, tuple)},
                           {k: v for k, v in peak.items() if not isinstance(k, tuple)})
        return self._found

    def peak_per_stage(self) -> list[int]:
        """Most microbatches in flight on each virtual stage (worst data-parallel replica)."""
        per_stage: dict[int, int] = defaultdict(int)
        for (_, s), v in self._peaks()[0].items():
            per_stage[s] = max(per_stage[s], v)
        return [per_stage.get(st, 0) for st in range(self.n_stages)]

    def peak_per_rank(self) -> list[int]:
        """Most microbatches in flight over all the virtual stages of each pipeline rank."""
        peak = self._peaks()[1]
        return [max(peak.get(d * self.pp + p, 0) for d in range(self.world // self.pp))
                for p in range(self.pp)]


def simulate(inp: SimInput) -> SimResult:
    """Predict one iteration of ``inp``; raises Deadlock when the action lists cannot finish."""
    return _Run(inp).go()
