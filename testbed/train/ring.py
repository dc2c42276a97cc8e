"""The data-parallel all-reduce of emulated compute: a ring all-reduce's bytes on the wire,
without its reduction arithmetic.

A ring all-reduce over d replicas takes 2(d−1) steps; in each, every rank sends one chunk of
gradient bytes / d to the next rank of the ring and receives one from the previous rank. After
each of the first d−1 steps (reduce-scatter) a rank adds the received chunk into its own; the
last d−1 steps (all-gather) only copy. Emulated compute never reads gradients, so here each
step is a P2P ``isend`` of a chunk-sized buffer to the next rank and an ``irecv`` into another
from the previous one, over the DP group; the next step starts when both are done, as in the
real ring. The addition is not done: its time on a GPU (``reduce_step_s``,
docs/architecture.md) is slept instead, so a busy 2-core box spends no CPU on arithmetic that
nothing reads, and the simulator (``testbed.sim.inputs.allreduce_s``) models the same steps.

Memory: one send and one receive buffer per rank, of at most ``PIECE_BYTES`` (a chunk larger
than that travels as several messages posted together), shared by every piece, step, stage and
iteration. The send buffer is never written (its pages stay the kernel's shared zero page);
receives into the one receive buffer only overwrite bytes that nothing reads.

Each step is traced as an ``ALLREDUCE_STEP`` comm record (``mb`` = the step, bytes = the
chunk, peer = the next rank) from the thread that drives the ring.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from testbed.spec.costs import FLOAT32_BYTES, reduce_step_s, ring_chunk_bytes

ns = time.monotonic_ns
# A step's chunk travels as messages of at most this many bytes, all posted at once (gloo
# keeps the order of messages with one tag between two ranks): the buffers stay this small
# however large the gradients are; the bytes on the wire are the same. Smaller pieces also
# moved faster: tests/train/test_emulated_dp.py's cell (13.7 MB per step over 1 Gbit/s host
# links, predicted 0.409 s) measured 0.64 s with 16 MiB pieces (and with whole chunks),
# 0.48 s with 4 MiB, 0.43 s with 1 MiB, 0.42 s with 256 KiB (one run each, busy machine);
# below 1 MiB the Python calls per piece grow for little gain.
PIECE_BYTES = 1 << 20


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


class EmulatedRing:
    """The emulated all-reduces of one pipeline rank over its DP replicas.

    ``ring``: the global ranks of the replicas in ring order (this rank at ``position``);
    ``numel``: gradient elements (float32) per virtual stage of this rank; ``tracer``: where
    the steps are recorded. Raises ValueError for a ring of fewer than 2 ranks."""

    def __init__(self, ring: list[int], position: int, group: Any, numel: dict[int, int],
                 tracer: Any):
        d = len(ring)
        if d < 2:
            raise ValueError(f"a ring all-reduce needs at least 2 replicas, got {d}")
        self.next, self.prev = ring[(position + 1) % d], ring[(position - 1) % d]
        self.d, self.steps, self.group, self.tr = d, 2 * (d - 1), group, tracer
        self.numel = dict(numel)
        self.chunk_numel = {s: ring_chunk_bytes(n * FLOAT32_BYTES, d) // FLOAT32_BYTES
                            for s, n in numel.items()}
        size = min(max(self.chunk_numel.values()), PIECE_BYTES // FLOAT32_BYTES)
        self.send_buf = torch.empty(size)  # never written: no resident pages
        self.recv_buf = torch.empty(size)  # written by every receive, read by nothing
        # one daemon thread per stage, started now and ended with the process: starting one
        # per all-reduce held the rank up to 2 ms on a busy box (Thread.start waits for it)
        self.jobs = {s: queue.SimpleQueue() for s in numel}
        for s, jobs in self.jobs.items():
            threading.Thread(target=self._serve, args=(s, jobs), name=f"dp-ring-{s}",
                             daemon=True).start()

    def start(self, it: int, stage: int) -> RingTransfer:
        """Start ``stage``'s all-reduce of iteration ``it`` in the stage's thread."""
        transfer = RingTransfer()
        self.jobs[stage].put((it, transfer))
        return transfer

    def _serve(self, stage: int, jobs: queue.SimpleQueue) -> None:
        while True:
            it, transfer = jobs.get()
            try:
                self._steps(it, stage)
            except BaseException as e:  # noqa: BLE001 — handed to the rank's thread in wait
                transfer.error = e
            transfer.done.set()

    def gradient_bytes(self, stage: int) -> int:
        """Bytes of ``stage``'s gradients (what a real all-reduce would reduce)."""
        return self.numel[stage] * FLOAT32_BYTES

    def pieces(self, stage: int) -> list[int]:
        """Elements of each message one step of ``stage`` sends (they add up to its chunk)."""
        n, most = self.chunk_numel[stage], self.send_buf.numel()
        return [most] * (n // most) + ([n % most] if n % most else [])

    def _steps(self, it: int, stage: int) -> None:
        n, pieces = self.chunk_numel[stage], self.pieces(stage)
        pause = reduce_step_s(n * FLOAT32_BYTES)
        for step in range(self.steps):
            tag = stage * self.steps + step
            t0 = ns()
            works = [w for k in pieces for w in (
                dist.isend(self.send_buf[:k], dst=self.next, tag=tag, group=self.group),
                dist.irecv(self.recv_buf[:k], src=self.prev, tag=tag, group=self.group))]
            for w in works:
                w.wait()
            self.tr.action(it, "ALLREDUCE_STEP", stage, step, t0, ns(), "comm",
                           n * FLOAT32_BYTES, self.next)
            if step < self.d - 1:
                time.sleep(pause)  # the reduction a GPU would do here, not done
