"""The data-parallel all-reduce of the workers: the ring steps of ``testbed.spec.allreduce``
(a flat ring, or hierarchical: reduce-scatter inside each DC, all-reduce between DCs,
all-gather inside), run over P2P between the replicas.

Each step sends one chunk to the next rank of its ring and receives one from the previous
rank, over the DP group (split over ``workload.connections`` TCP connections when there are
several groups), the receive posted first (``_exchange``); the next step starts when both are
done. Real compute moves slices of the real (flattened, padded) gradients and adds what a
reduce-scatter step receives: a real all-reduce with the same algorithm (a low-communication
outer all-reduce in ``outer_dtype`` sends each slice encoded, ``testbed.train.wirecodec``).
Emulated compute never reads gradients: each step is a send from a buffer nothing writes and a
receive into one nothing reads, and the addition is not done: its time on a GPU
(``reduce_step_s``, docs/architecture.md) is slept instead, so a busy 2-core box spends no CPU
on arithmetic nothing reads, and the simulator (``testbed.sim.collective``) models the same
steps.

Memory (emulated): one send and one receive buffer per rank, of at most ``PIECE_BYTES`` (a
chunk larger than that travels as several messages posted together), shared by every piece,
step, stage and iteration. The send buffer is never written (its pages stay the kernel's
shared zero page).

Each step is traced as an ``ALLREDUCE_STEP`` comm record (``mb`` = the step's index over the
stage's buckets, bytes = the chunk, peer = the rank sent to, ``bucket`` = its bucket) from the
thread that drives the stage's all-reduce.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from testbed.spec.allreduce import Step, steps_of
from testbed.spec.costs import FLOAT32_BYTES, reduce_step_s
from testbed.train.transport import Transport
from testbed.train.wirecodec import WireCodec

ns = time.monotonic_ns
# A step's chunk travels as messages of at most this many bytes, all posted at once (gloo
# keeps the order of messages with one tag between two ranks): the buffers stay this small
# however large the gradients are; the bytes on the wire are the same. Smaller pieces also
# moved faster: tests/train/test_emulated_dp.py's cell (13.7 MB per step over 1 Gbit/s host
# links, predicted 0.409 s) measured 0.64 s with 16 MiB pieces (and with whole chunks),
# 0.48 s with 4 MiB, 0.43 s with 1 MiB, 0.42 s with 256 KiB (one run each, busy machine);
# below 1 MiB the Python calls per piece grow for little gain.
PIECE_BYTES = 1 << 20


# a stage's steps are tagged stage × STAGE_TAGS + step index (within the DP groups)
STAGE_TAGS = 1 << 20


class RingTransfer:
    """One stage's all-reduce in flight; ``wait`` blocks until its last step is done and
    re-raises the error a step hit (e.g. the process group's timeout)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None

    def wait(self) -> None:
        self.done.wait()
        if self.error is not None:
            raise self.error


class GradientRing:
    """The all-reduces of one pipeline rank's stages: ``steps[stage]`` from
    ``testbed.spec.allreduce``; ``numel[stage]`` gradient elements; ``transport`` over the DP
    group(s) (default: ``group`` alone); ``tracer`` records the steps. Real compute passes the
    flattened gradients to ``start``; emulated compute passes none."""

    def __init__(self, steps: dict[int, list[Step]], group: Any, numel: dict[int, int],
                 tracer: Any, transport: Transport | None = None,
                 codec: WireCodec | None = None):
        # an IDLE step (hierarchical over unequal DCs) only keeps the steps' numbering: its
        # rank has nothing to send or receive, so it goes on to its next step at once
        self.steps = {s: [st for st in v if not st.idle] for s, v in steps.items()}
        self.numel, self.tr = dict(numel), tracer
        self._ends = {s: _bucket_ends(v) for s, v in self.steps.items()}
        self.transport = transport or Transport([group])
        self.codec = codec  # real compute: the chunks' type on the wire (default float32)
        self._bucket_t0: dict[int, int] = {}  # each stage's current bucket's first step start
        self.chunk_numel = {s: max((st.numel for st in v), default=0) for s, v in steps.items()}
        size = min(max(self.chunk_numel.values(), default=1) or 1, PIECE_BYTES // FLOAT32_BYTES)
        self.send_buf = torch.empty(size)  # never written: no resident pages
        self.recv_buf = torch.empty(size)  # written by every receive, read by nothing
        # one daemon thread per stage, started now and ended with the process: starting one
        # per all-reduce held the rank up to 2 ms on a busy box (Thread.start waits for it)
        self.jobs = {s: queue.SimpleQueue() for s in numel}
        for s, jobs in self.jobs.items():
            threading.Thread(target=self._serve, args=(s, jobs), name=f"dp-ring-{s}",
                             daemon=True).start()

    def start(self, it: int, stage: int, flat: torch.Tensor | None = None) -> RingTransfer:
        """Start ``stage``'s all-reduce of iteration ``it`` in the stage's thread (``flat``:
        the real gradients, summed over the replicas in place)."""
        transfer = RingTransfer()
        self.jobs[stage].put((it, flat, transfer))
        return transfer

    def _serve(self, stage: int, jobs: queue.SimpleQueue) -> None:
        while True:
            it, flat, transfer = jobs.get()
            try:
                if flat is None:
                    self._emulated(it, stage)
                else:
                    self._real(it, stage, flat)
            except BaseException as e:  # noqa: BLE001 — handed to the rank's thread in wait
                transfer.error = e
            transfer.done.set()

    def gradient_bytes(self, stage: int) -> int:
        """Bytes of ``stage``'s gradients (what a real all-reduce would reduce)."""
        return self.numel[stage] * FLOAT32_BYTES

    def pieces(self, stage: int, numel: int | None = None) -> list[int]:
        """Elements of each message one step of ``stage`` (of ``numel`` elements; default its
        largest) sends: they add up to the chunk."""
        n = self.chunk_numel[stage] if numel is None else numel
        most = self.send_buf.numel()
        return [most] * (n // most) + ([n % most] if n % most else [])

    def _trace(self, it: int, stage: int, st: Step, t0: int) -> None:
        """Record step ``st``; after a bucket's last step, the bucket (first step's start to
        now, its bytes sent)."""
        if self.tr is None:
            return
        t1 = ns()
        self.tr.action(it, "ALLREDUCE_STEP", stage, st.index, t0, t1, "comm",
                       self._wire_bytes(st.numel), st.send_to)
        steps, (first, last) = self.steps[stage], self._ends[stage]
        if st.index in first:
            self._bucket_t0[stage] = t0
        if st.index in last:
            sent = sum(self._wire_bytes(x.numel) for x in steps if x.bucket == st.bucket)
            self.tr.action(it, "ALLREDUCE_BUCKET", stage, st.bucket, self._bucket_t0[stage], t1,
                           "comm", sent, None)

    def _emulated(self, it: int, stage: int) -> None:
        for st in self.steps[stage]:
            t0 = ns()
            self._exchange([(self.send_buf[:k], self.recv_buf[:k])
                            for k in self.pieces(stage, st.numel)], stage, st)
            self._trace(it, stage, st, t0)
            if st.reduce:
                time.sleep(reduce_step_s(st.numel * FLOAT32_BYTES))  # not done: slept

    def _exchange(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], stage: int,
                  st: Step) -> None:
        """Send each (out, into) pair's ``out`` to ``st.send_to`` while receiving ``into`` from
        ``st.recv_from`` (tagged with ``stage``'s step), and wait for all. Each receive is
        posted before its send: gloo tells the sender a receive is ready over the pair's
        connection, behind whatever this rank has already written to it, so a send first made
        the peer's chunk wait for this rank's (across a 20 ms, 100 Mbit/s link, a step with a
        new peer took 70 ms instead of 55: results/leads/hierarchical-intra-step/)."""
        tag = stage * STAGE_TAGS + st.index
        works = [w for out, into in pairs for w in (
            self.transport.irecv(into, st.recv_from, tag),
            self.transport.isend(out, st.send_to, tag))]
        for w in works:
            w.wait()

    def _wire_bytes(self, numel: int) -> int:
        """Bytes a step of ``numel`` elements sends (emulated: float32 elements as sent)."""
        return self.codec.nbytes(numel) if self.codec else numel * FLOAT32_BYTES

    def _real(self, it: int, stage: int, flat: torch.Tensor) -> None:
        if self.codec is not None:
            return self._real_coded(it, stage, flat)
        buckets = self._buckets(stage, flat)
        for st in self.steps[stage]:
            start, n, buf = buckets[st.bucket]
            got = torch.empty(st.numel)
            t0 = ns()
            self._exchange([(buf[st.send_at:st.send_at + st.numel], got)], stage, st)
            if st.reduce:
                buf[st.recv_at:st.recv_at + st.numel] += got
            else:
                buf[st.recv_at:st.recv_at + st.numel] = got
            self._trace(it, stage, st, t0)
        self._unpack(buckets, flat)

    def _real_coded(self, it: int, stage: int, flat: torch.Tensor) -> None:
        """As ``_real``, each chunk sent in ``codec``'s type and added in float32. A sender
        keeps what its peer decodes; a chunk a gather step received is forwarded as the
        message it came in, so every replica ends with the same values."""
        codec, buckets = self.codec, self._buckets(stage, flat)
        gathered: dict[tuple[int, int], torch.Tensor] = {}  # (bucket, offset) → its message
        for st in self.steps[stage]:
            *_, buf = buckets[st.bucket]
            out = buf[st.send_at:st.send_at + st.numel]
            msg = gathered.get((st.bucket, st.send_at))
            if msg is None or msg.numel() != codec.nbytes(st.numel):
                msg = codec.encode(out)
                out.copy_(codec.decode(msg, st.numel))
            got = torch.empty(codec.nbytes(st.numel), dtype=torch.uint8)
            t0 = ns()
            self._exchange([(msg, got)], stage, st)
            into = buf[st.recv_at:st.recv_at + st.numel]
            if st.reduce:
                into += codec.decode(got, st.numel)
                gathered.pop((st.bucket, st.recv_at), None)
            else:
                into.copy_(codec.decode(got, st.numel))
                gathered[(st.bucket, st.recv_at)] = got
            self._trace(it, stage, st, t0)
        self._unpack(buckets, flat)

    def _buckets(self, stage: int, flat: torch.Tensor) -> dict[int, tuple]:
        """Each bucket of ``stage``'s steps: (its first element in ``flat``, its elements, a
        zero-padded float32 copy that its steps' slices index)."""
        steps, buckets, start = self.steps[stage], {}, 0
        for b in sorted({st.bucket for st in steps}):
            mine = [st for st in steps if st.bucket == b]
            end = max(max(st.send_at, st.recv_at) + st.numel for st in mine)
            n = min(end, flat.numel() - start)  # the bucket's elements; the rest is padding
            buf = torch.zeros(end)
            buf[:n] = flat[start:start + n]
            buckets[b] = (start, n, buf)
            start += n
        return buckets

    @staticmethod
    def _unpack(buckets: dict[int, tuple], flat: torch.Tensor) -> None:
        for start, n, buf in buckets.values():
            flat[start:start + n] = buf[:n]


def _bucket_ends(steps: list[Step]) -> tuple[set[int], set[int]]:
    """The indices of each bucket's first and last step in ``steps``."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for st in steps:
        first.setdefault(st.bucket, st.index)
        last[st.bucket] = st.index
    return set(first.values()), set(last.values())


def EmulatedRing(ring: list[int], position: int, group: Any, numel: dict[int, int],
                 tracer: Any) -> GradientRing:
    """A flat ring all-reduce over ``ring`` (this rank at ``position``) of each stage's
    ``numel`` elements. Raises ValueError for a ring of fewer than 2 ranks."""
    if len(ring) < 2:
        raise ValueError(f"a ring all-reduce needs at least 2 replicas, got {len(ring)}")
    return GradientRing({s: steps_of([ring], ring[position], n) for s, n in numel.items()},
                        group, numel, tracer)
