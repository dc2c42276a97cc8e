"""The data-parallel all-reduce in simulated time: every ring step of every rank
(``testbed.spec.allreduce``, the steps the workers run) as a transfer on the same link FIFOs
as the pipeline's messages.

Model of one step i of rank r, sending to n and receiving from p (as ``testbed.train.ring``
runs it): r posts its send and its receive when its step i − 1 is done (step 0: when the
stage's all-reduce starts). Gloo sends the bytes once r knows n's receive is posted (n's post
time + the one-way delay n → r). The transfer then waits for every shaped hop of the path and
for the pair's DP connection (``dp r->n``; the pipeline's messages use ``conn r->n``),
occupies them for its serialization (quantum by quantum, see ``QUANTUM_BYTES``) and arrives
one delay plus ``MESSAGE_LATENCY_S`` later.
r's step is done when its own bytes have left and p's have arrived, plus, for a
reduce-scatter step, the modelled addition (``reduce_step_s``) and the sleep's overshoot.
An ``IDLE`` step (hierarchical over unequal DCs) is done as soon as it is posted.
Transfers of different stages, replicas and pipeline messages queue on a shared hop in the
order they are issued, so all-reduces that cross one WAN link direction take turns on it.
Where every emulated host is a process of one machine (``SimInput.host_bytes_per_s``), the
unshaped transfers of all rings share that machine's copying rate (``HOST_HOP``); pipeline
messages on unshaped paths keep the pair's own rate.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any, Callable

from testbed.sim import calibration as C
from testbed.sim.iteration import Path, SimInput, SimResult, Span
from testbed.sim.rings import Ring, ring_times
from testbed.spec.allreduce import Step
from testbed.spec.costs import FLOAT32_BYTES, reduce_step_s

# A chunk is sent in quanta that queue one by one: a transfer issued meanwhile on a shared hop
# (a pipeline message, another stage's chunk) waits behind the quantum in service, not behind
# the whole chunk. A quantum is the bottleneck's queue limit (``Path.queue_bytes``): a long
# TCP flow, ACK-clocked, keeps at most that much queued ahead of a newcomer, while a transfer
# that fits in the queue enters it whole (first come, first served); on an unshaped path one
# GSO packet (64 KiB). Never below 1/MAX_QUANTA of the chunk (it bounds the events per chunk).
QUANTUM_BYTES = 1 << 16
MAX_QUANTA = 256
# With ``SimInput.host_bytes_per_s`` (every emulated host a process of one machine), an unshaped
# transfer's quanta also pass this hop, which each holds for its bytes at that rate: n of them
# at once each get min(the pair's rate, the host's / n), as the machine's CPUs copy them all.
HOST_HOP = "host"
Push = Callable[..., None]  # push(t, fn, *args): call fn(t, *args) at simulated time t


def quantum_bytes(path: Path, total: int, sent: int) -> int:
    """The bytes of a ``total``-byte transfer that queue next once ``sent`` are out."""
    return min(total - sent, max(path.queue_bytes or QUANTUM_BYTES, total // MAX_QUANTA))


class Collectives:
    """The all-reduces of one simulated iteration. ``start(t, stage, rank)`` begins one rank's
    part; ``end_of(rank)`` is when its last one ended (None while one is unfinished)."""

    def __init__(self, inp: SimInput, push: Push, hop_free: dict[str, float],
                 spans: list[Span]):
        self.inp, self.push, self.hop_free, self.spans = inp, push, hop_free, spans
        self.posted: dict[tuple, float] = {}     # (stage, rank, i) → step i posted
        self.left: dict[tuple, float] = {}       # (stage, rank, i) → its bytes have left
        self.arrived: dict[tuple, float] = {}    # (stage, rank, i) → the bytes it receives
        self.issued: set[tuple] = set()
        self.ended: dict[tuple[int, int], float] = {}  # (stage, rank) → all steps done
        self.lone: dict[Ring, bool] = {}
        self.deferred: dict[tuple[int, Ring], dict[int, float]] = {}
        self._stages: dict[int, list[int]] = {}

    def steps(self, stage: int, rank: int) -> list[Step]:
        return self.inp.collectives.get(rank, {}).get(stage, [])

    def start(self, t: float, stage: int, rank: int) -> None:
        """Rank ``rank``'s all-reduce of ``stage`` begins at ``t``."""
        ring = self._lone_ring(stage, rank)
        if ring is not None:  # timed at once when the iteration's events are done
            self.deferred.setdefault((stage, ring), {})[rank] = t
            return
        self._post(t, stage, rank, 0)

    def _lone_ring(self, stage: int, rank: int) -> Ring | None:
        """``stage``'s ring through ``rank`` when nothing else shares its transfers'
        resources (``testbed.sim.rings``), else None (also with ``exhaustive``)."""
        ring_of = getattr(self.inp.collectives, "ring", None)
        if self.inp.exhaustive or ring_of is None or self.inp.host_bytes_per_s is not None:
            return None  # with a shared host, every ring's transfers share its rate
        ring = ring_of(stage, rank)
        if ring is not None and ring not in self.lone:
            k = len(ring.ranks)
            self.lone[ring] = all(
                len(self.stages_of(r)) == 1
                and not self.inp.path(r, ring.ranks[(j + 1) % k]).hops
                for j, r in enumerate(ring.ranks))
        return ring if ring is not None and self.lone[ring] else None

    def finish(self) -> None:
        """Time the deferred rings whose ranks all started (a ring missing one never ends,
        as in the event model: the engine reports the deadlock)."""
        for (stage, ring), starts in self.deferred.items():
            if len(starts) < len(ring.ranks):
                continue
            k = len(ring.ranks)
            nxt = [ring.ranks[(j + 1) % k] for j in range(k)]
            times = ring_times(ring, [starts[r] for r in ring.ranks],
                               [self.inp.path(r, n) for r, n in zip(ring.ranks, nxt)],
                               [self.inp.path(n, r) for r, n in zip(ring.ranks, nxt)])
            for j, r in enumerate(ring.ranks):
                self.ended[(stage, r)] = float(times.done[j])
                # one record from the first post to the last bytes out: what the readouts
                # take of the steps (their first start, their last end)
                self.spans.append(Span(r, "ALLREDUCE_STEP", stage, None,
                                       float(times.first_posted[j]),
                                       float(times.last_left[j]), "comm"))
        self.deferred.clear()

    def _post(self, t: float, stage: int, rank: int, i: int) -> None:
        steps = self.steps(stage, rank)
        if i == len(steps):
            self.ended[(stage, rank)] = t
            return
        st = steps[i]
        if st.idle:  # waits out the other ranks' step i: nothing of its own to do
            return self._post(t, stage, rank, i + 1)
        self.posted[(stage, rank, i)] = t
        self._try_send(stage, rank, i, st.send_to)
        self._try_send(stage, st.recv_from, i, rank)

    def _try_send(self, stage: int, src: int, i: int, dst: int) -> None:
        """Issue src's step-i transfer to dst once both have posted step i."""
        key = (stage, src, i)
        if key in self.issued or key not in self.posted or (stage, dst, i) not in self.posted:
            return
        self.issued.add(key)
        known = self.posted[(stage, dst, i)] + self.inp.path(dst, src).delay_s
        self.push(max(self.posted[key], known), self._transfer, stage, src, i, dst)

    def _transfer(self, t: float, stage: int, src: int, i: int, dst: int,
                  sent: int = 0) -> None:
        """Send the next quantum of src's step-i chunk (``sent`` bytes are out); the next one
        queues again, behind whatever was issued on its hops meanwhile."""
        st = self.steps(stage, src)[i]
        total = st.numel * FLOAT32_BYTES
        path = self.inp.path(src, dst)
        quantum = (total - sent) if (not self.inp.exhaustive and self._alone(path, src)) \
            else quantum_bytes(path, total, sent)
        hops = path.hops + (f"dp {src}->{dst}",)
        host = None if path.hops else self.inp.host_bytes_per_s
        start = max([t] + [self.hop_free[h] for h in hops + ((HOST_HOP,) if host else ())])
        burst = path.burst_at(start, self.hop_free)
        left = start + path.serialization_s(max(0.0, quantum - burst))
        for h in hops:
            self.hop_free[h] = left
        if host:  # the machine's copying, shared quantum by quantum with every unshaped one
            self.hop_free[HOST_HOP] = start + quantum / host
        if sent + quantum < total:
            self.push(left, self._transfer, stage, src, i, dst, sent + quantum)
            return
        self.left[(stage, src, i)] = left
        self.arrived[(stage, dst, i)] = left + path.delay_s + C.MESSAGE_LATENCY_S
        self.spans.append(Span(src, "ALLREDUCE_STEP", stage, i, self.posted[(stage, src, i)],
                               left, "comm"))
        self._try_finish(stage, src, i)
        self._try_finish(stage, dst, i)

    def _alone(self, path: Path, src: int) -> bool:
        """Whether nothing else can queue on this transfer's hops while it is in service: no
        shaped hop, and one stage of ``src`` all-reduces over its connection (its steps follow
        one another). Then its quanta would go back to back: it is sent whole, the same."""
        return not path.hops and len(self.stages_of(src)) <= 1 and \
            self.inp.host_bytes_per_s is None

    def _try_finish(self, stage: int, rank: int, i: int) -> None:
        key = (stage, rank, i)
        if key not in self.left or key not in self.arrived:
            return
        st = self.steps(stage, rank)[i]
        end = max(self.left[key], self.arrived[key])
        if st.reduce:
            end += reduce_step_s(st.numel * FLOAT32_BYTES) + C.SLEEP_OVERSHOOT_S
        self.push(end, self._post, stage, rank, i + 1)

    def stages_of(self, rank: int) -> list[int]:
        found = self._stages.get(rank)
        if found is None:
            quick = getattr(self.inp.collectives, "stages_of", None)
            found = self._stages[rank] = (
                quick(rank) if quick is not None else
                [s for s, steps in self.inp.collectives.get(rank, {}).items() if steps])
        return found

    def end_of(self, rank: int) -> float | None:
        """When ``rank``'s last all-reduce ended (0 without any); None while one is pending."""
        ends = [self.ended.get((s, rank)) for s in self.stages_of(rank)]
        return None if None in ends else max(ends, default=0.0)


def exposed_hidden(spans: list[tuple[str, float, float]]) -> tuple[float, float] | None:
    """(exposed, hidden) of one rank's iteration from its (kind, t0, t1) records: the
    ALLREDUCE_WAIT, and the rest from the first all-reduce's start (ALLREDUCE, else its first
    step's) to the end of the last step or wait; None without an all-reduce."""
    starts = [t0 for k, t0, _ in spans if k == "ALLREDUCE"] or \
        [t0 for k, t0, _ in spans if k == "ALLREDUCE_STEP"]
    steps = [t1 for k, _, t1 in spans if k == "ALLREDUCE_STEP"]
    wait = [(t0, t1) for k, t0, t1 in spans if k == "ALLREDUCE_WAIT"]
    if not wait or not steps:
        return None
    exposed = sum(t1 - t0 for t0, t1 in wait)
    total = max(max(steps), max(t1 for _, t1 in wait)) - min(starts)
    return exposed, max(0.0, total - exposed)


def rank_splits(res: SimResult) -> list[tuple[float, float]]:
    """``exposed_hidden`` of every rank of one simulated iteration that all-reduced."""
    by_rank = ([(sp.kind, sp.t0, sp.t1) for sp in own] for own in res.allreduce.values())
    return [s for s in map(exposed_hidden, by_rank) if s is not None]


def predicted_allreduce(res: SimResult) -> dict[str, Any]:
    """``predicted_allreduce_exposed_s`` and ``…_hidden_s``: ``exposed_hidden`` of every rank
    of one simulated iteration, mean over ranks (empty without an all-reduce)."""
    splits = rank_splits(res)
    if not splits:
        return {}
    return {"predicted_allreduce_exposed_s": round(statistics.fmean(e for e, _ in splits), 6),
            "predicted_allreduce_hidden_s": round(statistics.fmean(h for _, h in splits), 6)}
