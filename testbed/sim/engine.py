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
  message to its path once its receive is known to be posted. Every shaped hop of the path is
  a queue per direction. A message that meets no other one becoming ready within
  ``BURST_TIE_S`` enters it first come, first served (htb + bfifo, and gloo's one TCP
  connection per rank pair, serve bytes in order): whole when it fits the bottleneck's queue
  limit, else quantum by quantum (``testbed.sim.collective.quantum_bytes``), so a transfer
  issued meanwhile waits behind one queue-full, not behind all of it. Messages that become
  ready together and meet on a hop share it at once (processor sharing: each at rate / n while
  n are left), as the bursts of concurrent TCP connections interleave in the queue: that is
  ``workload.wan_sharing: fair`` among replicas' pipelines; ``temporal`` staggers the
  replicas' starts (``start_offsets``, ``testbed.plan.sharing``). A transfer occupies its hops
  for bytes × 8 / the bottleneck rate, and arrives one propagation delay (the sum over hops)
  and ``MESSAGE_LATENCY_S`` of software later. Unshaped paths move ``UNSHAPED_BYTES_PER_S``;
- a RECV blocks until its message has arrived; the blocked time is exposed communication;
- after its last action a rank waits for its sends to leave (SEND_WAIT), then, with dp > 1,
  for its stages' data-parallel all-reduces (ALLREDUCE_WAIT, exposed communication). A
  stage's all-reduce starts when its last backward (B or W) ends (``overlap``, as the
  executor does) or after the SEND_WAIT; its ring steps are transfers on the same hops as the
  pipeline's (``testbed.sim.collective``).

Not modelled: TCP slow start and congestion control, packet loss and retransmission, jitter,
time-varying link steps, CPU contention between ranks, barrier skew.
"""
from __future__ import annotations

import heapq
from collections import defaultdict

from testbed.schedule.ir import Action, Kind, Schedule
from testbed.sim import calibration as C
from testbed.sim.collective import Collectives, quantum_bytes
from testbed.sim.iteration import Deadlock, SimInput, SimResult, Span, duration


LAST = 1 << 40  # added to an event's sequence number: after the others of its time


class _Run:
    """The state of one simulated iteration; ``go`` runs it."""

    def __init__(self, inp: SimInput):
        self.inp, self.s = inp, inp.schedule
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
        self.sending: dict[int, int] = defaultdict(int)  # messages with quanta still to send
        self.send_wait: dict[int, float] = {}  # ranks at their end waiting for those
        self.starting: dict[float, list] = {}  # messages ready within one BURST_TIE_S
        self.batch_until: float | None = None
        self.collectives = Collectives(inp, self.push, self.hop_free, self.spans)
        # the action after which each stage's gradients are complete (its last B or W)
        self.grads_done = [{} for _ in range(self.s.pp)]
        for p in range(self.s.pp):
            for i, a in enumerate(self.s.actions[p]):
                if a.kind in (Kind.B, Kind.W):
                    self.grads_done[p][a.stage] = i

    def push(self, t: float, fn, *args, last: bool = False) -> None:
        """Call ``fn(t, *args)`` at simulated time ``t`` (ties in the order pushed; ``last``:
        after every event of time ``t`` pushed without it)."""
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq + (LAST if last else 0), fn, args))

    def go(self) -> SimResult:
        for r in range(self.world):
            self.push(self._post_receives(r), self._step, r)
        while self.events:
            t, _, fn, args = heapq.heappop(self.events)
            fn(t, *args)
        if len(self.done) < self.world:
            stuck = {r: str(self._actions(r)[self.pos[r]]) for r in range(self.world)
                     if r not in self.done}
            raise Deadlock(f"deadlock: ranks wait on {stuck}")
        return self._result(self._all_reduce())

    def _post_receives(self, r: int) -> float:
        """Post rank ``r``'s receives in list order and record when each sender learns of its
        receive. Returns the time the rank's first action starts."""
        t = self.inp.start_offsets.get(r, 0.0)
        for a in self._actions(r):
            if a.kind in (Kind.RECV_F, Kind.RECV_B):
                t += C.POST_RECV_S
                key = self._recv_key(r, a)
                sender = self._global(r, key[2])
                self.recv_known[key] = t + self.inp.path(r, sender).delay_s
        return t

    def _recv_key(self, r: int, a: Action) -> tuple:
        """The message a RECV waits for: (replica, direction, sending stage, microbatch)."""
        fwd = a.kind is Kind.RECV_F
        return (r // self.s.pp, "F" if fwd else "B", a.stage - 1 if fwd else a.stage + 1,
                a.microbatch)

    def _actions(self, rank: int) -> list[Action]:
        return self.s.actions[rank % self.s.pp]

    def _global(self, rank: int, stage: int) -> int:
        return (rank // self.s.pp) * self.s.pp + self.s.stage_to_rank[stage]

    def _step(self, t: float, r: int) -> None:
        acts = self._actions(r)
        if self.pos[r] == len(acts):
            if self.sending[r]:  # finished once its last send's last quantum has left
                self.send_wait[r] = t
                return
            end = max(t, self.sent_by[r])
            self.spans.append(Span(r, "SEND_WAIT", None, None, t, end, "wait"))
            self.done[r] = end
            if not self.inp.overlap:
                for stage in self.collectives.stages_of(r):
                    self.collectives.start(end, stage, r)
            return
        a = acts[self.pos[r]]
        if a.kind.is_compute:
            dur = duration(self.inp.times[a.stage], a.kind) + C.SLEEP_OVERSHOOT_S
            self._advance(r, a, t, t + dur, "compute")
            self.memory.update(r, a, t + dur)
            if self.inp.overlap and self.grads_done[r % self.s.pp].get(a.stage) == self.pos[r] - 1:
                self.collectives.start(t + dur, a.stage, r)
        elif a.kind in (Kind.SEND_F, Kind.SEND_B):
            self._send(r, a, t)
            self._advance(r, a, t, t + C.SEND_CALL_S, "comm")
        else:
            self._recv(r, a, t)

    def _advance(self, r: int, a: Action, t0: float, t1: float, cat: str) -> None:
        self.spans.append(Span(r, a.kind.value, a.stage, a.microbatch, t0, t1, cat))
        self.pos[r] += 1
        self.push(t1 + C.ACTION_GAP_S, self._step, r)

    def _send(self, r: int, a: Action, t: float) -> None:
        fwd = a.kind is Kind.SEND_F
        dst = self._global(r, a.stage + 1 if fwd else a.stage - 1)
        key = (r // self.s.pp, "F" if fwd else "B", a.stage, a.microbatch)
        self.sending[r] += 1
        ready = max(t, self.recv_known.get(key, 0.0))
        if self.batch_until is None or ready > self.batch_until:
            self.batch_until = ready + C.BURST_TIE_S
            self.push(self.batch_until, self._start_sends, self.batch_until, last=True)
            self.starting[self.batch_until] = []
        self.starting[self.batch_until].append((ready, r, dst, key))

    def _start_sends(self, t: float, batch_key: float) -> None:
        """Start the messages that became ready within ``BURST_TIE_S`` of each other: those
        that meet on a shaped hop share it at once (TCP's fair share of bursts sent together:
        processor sharing, each at rate / n while n are left); the others enter its queue
        whole, first come, first served (``_quantum``)."""
        batch = sorted(self.starting.pop(batch_key))
        if self.batch_until == batch_key:
            self.batch_until = None
        users: dict[str, list[int]] = defaultdict(list)
        for i, (_, r, dst, _) in enumerate(batch):
            for h in self.inp.path(r, dst).hops:
                users[h].append(i)
        shared = {i for group in users.values() if len(group) > 1 for i in group}
        for i, (ready, r, dst, key) in enumerate(batch):
            if i not in shared:
                self._quantum(ready, r, dst, key, 0)
        if shared:
            self._share([batch[i] for i in sorted(shared)])

    def _share(self, group: list) -> None:
        """Processor sharing among ``group`` from when all their hops are free."""
        paths = [self.inp.path(r, dst) for _, r, dst, _ in group]
        hops = {h for (_, r, dst, _), p in zip(group, paths)
                for h in p.hops + (f"conn {r}->{dst}",)}
        start = max([g[0] for g in group] + [self.hop_free[h] for h in hops])
        ser = sorted((p.serialization_s(self.inp.message_bytes), i) for i, p in enumerate(paths))
        done, n = 0.0, len(ser)
        for k, (s, i) in enumerate(ser):
            left = start + done + (n - k) * (s - (ser[k - 1][0] if k else 0.0))
            done = left - start
            self._sent(group[i][1], group[i][3], paths[i], left)
        for h in hops:
            self.hop_free[h] = start + done

    def _quantum(self, t: float, r: int, dst: int, key: tuple, sent: int) -> None:
        """Send the next quantum of message ``key`` (``sent`` bytes are out) from ``t``; the
        next one queues again, behind what was issued on its hops meanwhile."""
        path = self.inp.path(r, dst)
        hops = path.hops + (f"conn {r}->{dst}",)
        q = quantum_bytes(path, self.inp.message_bytes, sent)
        start = max([t] + [self.hop_free[h] for h in hops])
        left = start + path.serialization_s(q)
        for h in hops:
            self.hop_free[h] = left
        if sent + q < self.inp.message_bytes:
            self.push(left, self._quantum, r, dst, key, sent + q)
            return
        self._sent(r, key, path, left)

    def _sent(self, r: int, key: tuple, path, left: float) -> None:
        """Message ``key`` of rank ``r`` has left at ``left``."""
        self.sent_by[r] = max(self.sent_by[r], left)
        self.arrival[key] = left + path.delay_s + C.MESSAGE_LATENCY_S
        if key in self.waiting:
            self.push(*self._wake(key))
        self.sending[r] -= 1
        if not self.sending[r] and r in self.send_wait:
            self._step(self.send_wait.pop(r), r)

    def _wake(self, key: tuple) -> tuple:
        rank, since = self.waiting.pop(key)
        return since, self._step, rank

    def _recv(self, r: int, a: Action, t: float) -> None:
        key = self._recv_key(r, a)
        if key not in self.arrival:
            self.waiting[key] = (r, t)  # woken (at t) once the send is issued
            return
        self._advance(r, a, t, max(t, self.arrival[key]), "wait")

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
        for sp in self.spans:
            if sp.cat == "compute":
                busy[sp.rank] += sp.t1 - sp.t0
            elif sp.cat == "wait":
                wait[sp.rank] += sp.t1 - sp.t0
        return SimResult(sorted(self.spans, key=lambda x: (x.rank, x.t0)), max(ends.values()),
                         busy, wait, self.memory.peak_per_stage(), self.memory.peak_per_rank())


class _Memory:
    """Activations held per (rank, virtual stage): one per microbatch from the end of its F to
    the end of its last backward action (W when the schedule splits the backward, else B)."""

    def __init__(self, s: Schedule, world: int):
        self.n_stages, self.pp, self.world = s.n_stages, s.pp, world
        self.release = {(a.stage, a.microbatch): a.kind for acts in s.actions for a in acts
                        if a.kind in (Kind.B, Kind.W)}
        self.events: list[tuple[float, int, int, int]] = []  # (t, +1/-1, rank, stage)

    def update(self, rank: int, a: Action, t: float) -> None:
        if a.kind is Kind.F:
            self.events.append((t, 1, rank, a.stage))
        elif self.release.get((a.stage, a.microbatch)) is a.kind:
            self.events.append((t, -1, rank, a.stage))

    def _peaks(self, key) -> dict:
        live: dict = defaultdict(int)
        peak: dict = defaultdict(int)
        for _, delta, rank, stage in sorted(self.events):  # frees before allocations at a tie
            k = key(rank, stage)
            live[k] += delta
            peak[k] = max(peak[k], live[k])
        return peak

    def peak_per_stage(self) -> list[int]:
        """Most microbatches in flight on each virtual stage (worst data-parallel replica)."""
        peak = self._peaks(lambda rank, stage: (rank, stage))
        return [max((v for (_, s), v in peak.items() if s == st), default=0)
                for st in range(self.n_stages)]

    def peak_per_rank(self) -> list[int]:
        """Most microbatches in flight over all the virtual stages of each pipeline rank."""
        peak = self._peaks(lambda rank, stage: rank)
        return [max(peak.get(d * self.pp + p, 0) for d in range(self.world // self.pp))
                for p in range(self.pp)]


def simulate(inp: SimInput) -> SimResult:
    """Predict one iteration of ``inp``; raises Deadlock when the action lists cannot finish."""
    return _Run(inp).go()
