"""A pipeline-parallel job on the optical network, iteration after iteration.

Each iteration is timed by the simulator's engine (``testbed.sim``) with a per-transfer hook:
when a stage issues a SEND to a stage in another DC, the transfer asks the network for a
lightpath of ``policy.slots(transfer)`` slots (+ guard) between the two DCs' nodes, routed by
``policy.order``; its bytes then move at slots × the grid's rate per slot and arrive one fiber
delay (5 µs/km of the route) later. The lightpath is held from the SEND until the last byte
has arrived. Transfers between stages of one DC use ``intra_dc_gbps`` and no lightpath.

A blocked transfer (no route has the slots when it is issued) does what ``blocked`` says:

- ``wait``: it waits for the first moment its slots come free on one of its routes as held
  lightpaths end, and reserves them meanwhile (nothing else takes them);
- ``fewer``: it takes the most slots it can get now, down to ``bounds.low``; if not even
  those are free, it waits for ``bounds.low`` slots as ``wait`` does.

Background traffic shares the spectrum (``testbed.optical.traffic``). After each iteration
the policy sees every cross-DC transfer's outcome, with how long its receiver waited on it.
Iterations follow one another without a gap; the network keeps its state across them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from testbed.optical.policy import SlotBounds, TransferId, TransferOutcome
from testbed.optical.rsa import RSA
from testbed.optical.traffic import Traffic
from testbed.schedule.generators import generate
from testbed.schedule.lower import lower
from testbed.sim import run
from testbed.sim.iteration import Path, SimInput, SimResult, TransferRequest

BLOCKED_CHOICES = ("wait", "fewer")


@dataclass(frozen=True)
class StageTime:
    """Compute time of one stage per microbatch (s): forward, backward (no split W)."""

    f: float
    b: float
    w: float = 0.0

    @property
    def i(self) -> float:
        return self.b - self.w


@dataclass(frozen=True)
class Job:
    """The training job: where its stages run and what they compute and send."""

    stage_dcs: list[str]
    schedule: str
    microbatches: int
    forward_s: float
    backward_s: float
    message_bytes: int
    intra_dc_gbps: float = 400.0


@dataclass
class IterationRecord:
    """One simulated iteration: its timeline's metrics and its transfers' outcomes."""

    start_s: float
    result: SimResult
    outcomes: list[TransferOutcome]
    waited_s: float = 0.0

    @property
    def span_s(self) -> float:
        return self.result.span_s


@dataclass
class _Transfers:
    """The engine's transfer hook for one iteration starting at ``offset`` (absolute s)."""

    run: "OpticalJobRun"
    offset: float
    asked: dict[TransferId, tuple[int, int, bool]] = field(default_factory=dict)
    waited_s: float = 0.0

    def __call__(self, req: TransferRequest) -> tuple[float, Path]:
        r, job = self.run, self.run.job
        _, direction, stage, mb = req.key
        dst_stage = stage + 1 if direction == "F" else stage - 1
        a = r.rsa.net.node_of(job.stage_dcs[stage])
        b = r.rsa.net.node_of(job.stage_dcs[dst_stage])
        if a == b:
            return req.ready_s, Path((), job.intra_dc_gbps * 1e9, 0.0)
        t = self.offset + req.issued_s
        r.traffic.until(r.rsa, t, r.policy.order)
        r.rsa.spectrum.advance(t)
        tid = TransferId(direction, stage, mb)
        asked = max(1, min(r.rsa.net.slots - r.rsa.net.guard_slots, int(r.policy.slots(tid))))
        start, slots, blocked, path = self._allocate(a, b, asked, t, self.offset + req.ready_s,
                                                     req.nbytes)
        self.asked[tid] = (asked, slots, blocked)
        self.waited_s += start - (self.offset + req.ready_s)
        r.traffic.on_event(r.rsa, t, r.policy.order)
        return start - self.offset, path

    def _allocate(self, a: str, b: str, asked: int, t: float, ready: float, nbytes: int
                  ) -> tuple[float, int, bool, Path]:
        rsa, run = self.run.rsa, self.run
        routes = rsa.routes(a, b, run.policy.order)
        got = rsa.spectrum.fit(routes, rsa.width(asked))
        blocked, slots, hold_from = got is None, asked, t
        rsa.count("job", blocked)
        if blocked and run.blocked == "fewer":
            for n in range(asked - 1, run.bounds.low - 1, -1):
                got, slots = rsa.spectrum.fit(routes, rsa.width(n)), n
                if got is not None:
                    break
        if got is None:
            hold_from, route, slot = rsa.spectrum.earliest_fit(routes, rsa.width(slots))
        else:
            route, slot = got
        start = max(ready, hold_from)
        path = Path((), slots * rsa.net.gbps_per_slot * 1e9, rsa.net.delay_s(route.km))
        end = start + path.serialization_s(nbytes) + path.delay_s
        rsa.spectrum.hold(route, slot, rsa.width(slots), hold_from, end)
        return start, slots, blocked, path


def receiver_waits(res: SimResult) -> dict[TransferId, float]:
    """How long each transfer's receiver was blocked on it while it was under way (from its
    SEND to its arrival), from the simulated timeline: waiting that a faster transfer would
    have shortened. Waiting for the sender's compute before the SEND does not count."""
    sent: dict[TransferId, float] = {}
    recv: dict[TransferId, tuple[float, float]] = {}
    for sp in res.spans:
        if sp.kind in ("SEND_F", "SEND_B"):
            sent[TransferId(sp.kind[-1], sp.stage, sp.microbatch)] = sp.t0
        elif sp.kind == "RECV_F":
            recv[TransferId("F", sp.stage - 1, sp.microbatch)] = (sp.t0, sp.t1)
        elif sp.kind == "RECV_B":
            recv[TransferId("B", sp.stage + 1, sp.microbatch)] = (sp.t0, sp.t1)
    return {tid: max(0.0, t1 - max(t0, sent.get(tid, t0))) for tid, (t0, t1) in recv.items()}


class OpticalJobRun:
    """A job, a network with its background traffic, and a policy: ``iterate()`` runs one
    more iteration and lets the policy see it."""

    def __init__(self, job: Job, rsa: RSA, traffic: Traffic, policy, bounds: SlotBounds,
                 blocked: str = "wait"):
        if blocked not in BLOCKED_CHOICES:
            raise ValueError(f"blocked must be one of {', '.join(BLOCKED_CHOICES)}")
        self.job, self.rsa, self.traffic, self.policy = job, rsa, traffic, policy
        self.bounds, self.blocked = bounds, blocked
        pp = len(job.stage_dcs)
        self.schedule = lower(generate(job.schedule, pp, job.microbatches))
        self.times = [StageTime(job.forward_s, job.backward_s)] * pp
        self.now = 0.0
        self.history: list[IterationRecord] = []

    def iterate(self) -> IterationRecord:
        hook = _Transfers(self, self.now)
        inp = SimInput(self.schedule, self.times, self.job.message_bytes, transfer=hook)
        res = run(inp)
        waits = receiver_waits(res)
        outcomes = [TransferOutcome(tid, asked, got, blocked, waits.get(tid, 0.0))
                    for tid, (asked, got, blocked) in hook.asked.items()]
        self.policy.observe(outcomes)
        rec = IterationRecord(self.now, res, outcomes, hook.waited_s)
        self.history.append(rec)
        self.now += res.span_s
        self.traffic.until(self.rsa, self.now, self.policy.order)
        return rec
