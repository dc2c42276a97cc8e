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
  bottleneck rate, less what the shaper's token bucket, refilled while the hops were idle,
  passes at once (``Path.burst_at``), and arrives one propagation delay (the sum over hops)
  and ``MESSAGE_LATENCY_S`` of software later. Unshaped paths move ``UNSHAPED_BYTES_PER_S``;
- a RECV blocks until its message has arrived; the blocked time is exposed communication;
- after its last action a rank waits for its sends to leave (SEND_WAIT), then, with dp > 1,
  for its stages' data-parallel all-reduces (ALLREDUCE_WAIT, exposed communication). A
  stage's all-reduce starts when its last backward (B or W) ends (``overlap``, as the
  executor does), after the SEND_WAIT, or with the iteration (``at_start``: an outer sync
  overlapped with an inner step); its ring steps are transfers on the same hops as the
  pipeline's (``testbed.sim.collective``).

Not modelled: TCP slow start and congestion control, packet loss and retransmission, jitter,
time-varying link steps, CPU contention between ranks, barrier skew."""
from __future__ import annotations

import gc
import heapq
from collections import defaultdict

from testbed.schedule.ir import Kind
from testbed.sim import calibration as C
from testbed.sim.collective import Collectives
from testbed.sim.memory import ActivationCount
from testbed.sim.messages import Messages
from testbed.sim.timeline import Timeline
from testbed.sim.iteration import (Deadlock, Path, SimInput, SimResult, Span,
                                   TransferRequest, duration)


class _Run:
    """The state of one simulated iteration; ``go`` runs it."""

    def __init__(self, inp: SimInput):
        self.inp, self.s = inp, inp.schedule
        self.pp, self.world = self.s.pp, inp.dp * self.s.pp
        self.pos = [0] * self.world
        self.events: list[tuple] = []  # (t, seq: ties in the order pushed, fn, args)
        self.seq = 0
        self.messages = Messages(self.s, inp.dp)
        self.arrival, self.waiting = self.messages.arrival, self.messages.waiting
        self.hop_free: dict[str, float] = defaultdict(float)
        self.sent_by: dict[int, float] = defaultdict(float)
        self.busy, self.wait = [0.0] * self.world, [0.0] * self.world
        self.done: dict[int, float] = {}
        self.memory = ActivationCount(self.s, self.world)
        self.compiled = [self._compile(p) for p in range(self.s.pp)]
        self.gap = C.ACTION_GAP_S
        self.spans = Timeline(self.world, self.pp, [
            [(k, a.stage, a.microbatch,
              "compute" if dur is not None else "comm" if peer is not None else "wait")
             for a, k, dur, *_, peer in acts] for acts in self.compiled], self.gap)
        self.collectives = Collectives(inp, self.push, self.hop_free, self.spans)
        # src × world + dst → ``_connect``'s (path, FIFO hops, shared?, serialization)
        self.conn: dict[int, tuple[Path, tuple[str, ...], bool, float]] = {}
        self.start_ar = inp.overlap and not inp.at_start  # all-reduces at the last backward
        self.step_fn = self._step  # one bound method for every step event
        self.one_by_one = inp.exhaustive or inp.transfer is not None

    def _compile(self, p: int) -> list[tuple]:
        """Pipeline rank ``p``'s actions with what ``_step`` needs of each, worked out once:
        (action, its kind's name, compute time or None, activations held (+1/−1 and the
        stage's slot, ``ActivationCount.hold``) or 0, whether its stage's gradients are
        complete after it, the number of the message it sends or waits for within its replica
        (``Messages.number``), the peer's pipeline rank)."""
        acts = self.s.actions[p]
        last_grad = {a.stage: i for i, a in enumerate(acts) if a.kind in (Kind.B, Kind.W)}
        out = []
        for i, a in enumerate(acts):
            fwd = a.kind in (Kind.SEND_F, Kind.RECV_F)
            if a.kind.is_compute:
                dur = duration(self.inp.times[a.stage], a.kind) + C.SLEEP_OVERSHOOT_S
                out.append((a, a.kind.value, dur,
                            self.memory.delta(a) and (self.memory.delta(a),
                                                      self.memory.slot_of[a.stage]),
                            last_grad.get(a.stage) == i, None, None))
            elif a.kind in (Kind.SEND_F, Kind.SEND_B):
                peer = self.s.stage_to_rank[a.stage + 1 if fwd else a.stage - 1]
                out.append((a, a.kind.value, None, 0, False,
                            self.messages.number(fwd, a.stage, a.microbatch), peer))
            else:
                out.append((a, a.kind.value, None, 0, False,
                            self.messages.number(fwd, a.stage - 1 if fwd else a.stage + 1,
                                                 a.microbatch), None))
        return out

    def push(self, t: float, fn, *args) -> None:
        """Call ``fn(t, *args)`` at simulated time ``t`` (ties in the order pushed)."""
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, fn, args))

    def go(self) -> SimResult:
        for r in range(self.world):
            start = self.spans.start[r] = self._post_receives(r)
            self.push(start, self._step, r)
            if self.inp.at_start:
                for stage in self.collectives.stages_of(r):
                    self.collectives.start(self.inp.start_offsets.get(r, 0.0), stage, r)
        events, pop = self.events, heapq.heappop
        while events:
            t, _, fn, args = pop(events)
            fn(t, *args)
        if len(self.done) < self.world:
            stuck = {r: str(self.s.actions[r % self.pp][self.pos[r]]) for r in range(self.world)
                     if r not in self.done}
            raise Deadlock(f"deadlock: ranks wait on {stuck}")
        self.collectives.finish()
        return self._result(self._all_reduce())

    def _post_receives(self, r: int) -> float:
        """Post rank ``r``'s receives in list order and record when each sender learns of its
        receive. Returns the time the rank's first action starts."""
        t = self.inp.start_offsets.get(r, 0.0)
        post, base, delay = C.POST_RECV_S, self.messages.base(r // self.pp), {}
        for a, *_, message, peer in self.compiled[r % self.pp]:
            if message is not None and peer is None:  # a receive
                t += post
                stage = a.stage - 1 if a.kind is Kind.RECV_F else a.stage + 1
                if stage not in delay:
                    delay[stage] = self.inp.path(r, self._global(r, stage)).delay_s
                self.messages.known[base + message] = t + delay[stage]
        return t

    def _global(self, rank: int, stage: int) -> int:
        return (rank // self.s.pp) * self.s.pp + self.s.stage_to_rank[stage]

    def _step(self, t: float, r: int) -> None:
        """Rank ``r`` goes on from ``t``, an event popped in time order: its actions one after
        another while nothing else can change their outcome (compute, a receive whose message
        has arrived, a send on a path with no shaped hop: its connection is the pair's own),
        up to a receive still waiting for its message, or a send onto shaped hops that other
        senders share, which waits as an event for its turn in time order (the FIFO's order).
        With ``exhaustive``, or a per-transfer network (``SimInput.transfer``: its allocation
        depends on the order in which simultaneous SENDs are issued), every action is its own
        event, in time order."""
        acts, i, first = self.compiled[r % self.pp], self.pos[r], True
        n, gap, ends, one_by_one = len(acts), self.gap, self.spans.ends[r].append, self.one_by_one
        base, first_rank = self.messages.base(r // self.pp), r // self.pp * self.pp
        busy, wait, arrival = self.busy, self.wait, self.arrival
        while True:
            if i == n:
                self.pos[r] = i
                return self._finish(t, r)
            if not first and one_by_one:
                break
            a, _, dur, held, grads_done, message, peer = acts[i]
            if dur is not None:
                t1 = t + dur
                ends(t1)
                busy[r] += t1 - t
                if held:
                    self.memory.hold(r, held[1], held[0])
                if grads_done and self.start_ar:
                    self.collectives.start(t1, a.stage, r)
            elif peer is not None:
                key, dst = base + message, first_rank + peer
                conn = self.conn.get(r * self.world + dst) or self._connect(r, dst)
                if conn[2]:
                    if not first:
                        break  # a shared FIFO: its turn comes in time order
                    self._send(r, t, key, dst, conn)
                else:
                    self._send_own(r, t, key, conn)
                t1 = t + C.SEND_CALL_S
                ends(t1)
            else:
                key = base + message
                arrived = arrival[key]
                if arrived < 0:
                    self.pos[r] = i
                    self.waiting[key] = (r, t)  # woken (at t) once the send is issued
                    return None
                t1 = arrived if arrived > t else t
                ends(t1)
                wait[r] += t1 - t
            i += 1
            t = t1 + gap
            first = False
        self.pos[r] = i
        self.seq += 1  # self.push(t, self._step, r), without the call
        heapq.heappush(self.events, (t, self.seq, self.step_fn, (r,)))
        return None

    def _finish(self, t: float, r: int) -> None:
        """Rank ``r``'s last action ended at ``t``: it waits for its sends to leave."""
        end = max(t, self.sent_by[r])
        self.spans.append(Span(r, "SEND_WAIT", None, None, t, end, "wait"))
        self.wait[r] += end - t
        self.done[r] = end
        if not self.inp.overlap and not self.inp.at_start:
            for stage in self.collectives.stages_of(r):
                self.collectives.start(end, stage, r)

    def _connect(self, r: int, dst: int) -> tuple[Path, tuple[str, ...], bool, float]:
        """The pair's path, the FIFO hops its messages occupy (its connection last), whether
        another sender can queue on them (a shaped hop, or a per-transfer network) and a
        message's serialization on the path."""
        path = self.inp.path(r, dst)
        shared = bool(path.hops) or self.inp.transfer is not None
        conn = self.conn[r * self.world + dst] = (path, path.hops + (f"conn {r}->{dst}",), shared,
                                      path.serialization_s(self.inp.message_bytes))
        return conn

    def _send_own(self, r: int, t: float, key: int, conn: tuple) -> None:
        """``_send`` on a connection no other sender touches (``conn[2]`` false, no burst)."""
        path, (hop,), _, ser = conn
        start, known, free = t, self.messages.known[key], self.hop_free[hop]
        if known > start:
            start = known
        if free > start:
            start = free
        left = self.hop_free[hop] = start + ser
        if left > self.sent_by[r]:
            self.sent_by[r] = left
        self.arrival[key] = left + path.delay_s + C.MESSAGE_LATENCY_S
        if key in self.waiting:
            self.push(*self._wake(key))

    def _send(self, r: int, t: float, key: int, dst: int, conn: tuple) -> None:
        """Rank ``r`` sends message ``key`` (global number) to global rank ``dst`` on ``conn``."""
        path, hops, _, ser = conn
        start = max(t, self.messages.known[key])
        hop_free = self.hop_free
        for h in hops:
            if hop_free[h] > start:
                start = hop_free[h]
        if self.inp.transfer is not None:  # a per-transfer allocation (testbed.optical)
            start, path = self.inp.transfer(TransferRequest(r, dst, self.messages.described(key), t,
                                                            start, self.inp.message_bytes))
            ser = path.serialization_s(self.inp.message_bytes)
        elif path.burst_bytes:  # the shaper's bucket passes the first bytes at once
            ser = path.serialization_s(max(0.0, self.inp.message_bytes
                                           - path.burst_at(start, hop_free)))
        left = start + ser
        for h in hops:
            hop_free[h] = left
        if left > self.sent_by[r]:
            self.sent_by[r] = left
        self.arrival[key] = left + path.delay_s + C.MESSAGE_LATENCY_S
        if key in self.waiting:
            self.push(*self._wake(key))

    def _wake(self, key: int) -> tuple:
        rank, since = self.waiting.pop(key)
        return since, self._step, rank

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
                self.wait[r] += ends[r] - done
        return ends

    def _result(self, ends: dict[int, float]) -> SimResult:
        return SimResult(self.spans, max(ends.values()), self.busy, self.wait,
                         self.memory.peak_per_stage(), self.memory.peak_per_rank(),
                         self.spans.sort_allreduce(), self.seq)


def simulate(inp: SimInput) -> SimResult:
    """Predict one iteration of ``inp``; raises Deadlock when the action lists cannot finish.

    The cyclic garbage collector is paused meanwhile: the run makes millions of tuples and
    no garbage cycle, and each of the collector's passes would walk every tuple made so far
    (a third of the time of an 8,192-rank cell)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return _Run(inp).go()
    finally:
        if paused:
            gc.enable()
