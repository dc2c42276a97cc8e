"""Starting every rank's iteration at one instant, through the rendezvous store.

Between iterations the ranks must (1) know that all of them have finished the iteration before
and (2) agree on a start time far enough ahead that the last to hear of it is not late. gloo's
barrier and broadcast each cost about ten one-way delays over a slow inter-DC link (measured:
a 4-rank barrier over one 40 ms link took ~0.41 s), so a sync built on them paid over a second
per iteration. Here each rank adds itself to a counter in the rendezvous store (one round
trip to the store); the rank that completes the count sets the start time (its arrival plus
the margin); the others' pending reads return it as soon as it is set: about two round trips
to the store plus the margin.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch.distributed as dist


class StoreWait:
    """Waiting for a store key, as a work object (``wait()``) that a filler can fill."""

    def __init__(self, store: dist.Store, key: str):
        self.store, self.key = store, key
        self.value: bytes | None = None

    def wait(self) -> bool:
        self.value = self.store.get(self.key)  # blocks until the key is set
        return True


def default_store() -> dist.Store:
    """The store the default process group rendezvoused through (a TCPStore at MASTER_ADDR)."""
    return dist.distributed_c10d._get_default_store()


def store_round_trip_ns(store: dist.Store) -> int:
    """This rank's round trip to the store (one counter increment, timed)."""
    t0 = time.monotonic_ns()
    store.add("sync/probe", 1)
    return time.monotonic_ns() - t0


# One store counter per iteration carries three sums: ranks arrived (bits 0-19), ranks that
# started the iteration before late (bits 20-39) and their lateness in ms (bits 40-62)
RANKS = 1 << 20
LATE_RANKS = 1 << 20
LATE_MS = 1 << 40
MS = 1_000_000


class StartSync:
    """Agrees on each iteration's start time (``time.time_ns``) across all ranks.

    The last rank to arrive sets it ``margin_ns`` ahead. The margin adapts: a rank that heard
    of the start too late (the link got slower, e.g. a time-varying step) says by how much
    when it arrives next; the last arrival then widens the margin by twice the mean lateness
    and hands the new margin on with the start time, so every rank keeps the same one."""

    def __init__(self, store: dist.Store, world: int, margin_ns: int):
        self.store, self.world, self.margin_ns = store, world, margin_ns
        self.late_ns = 0

    def agree(self, it: int, await_start=lambda work: work.wait()) -> int:
        """Iteration ``it``'s start time; returns once every rank has called it.
        ``await_start`` waits for the start time (a filler may fill that wait)."""
        late_ms = -(-self.late_ns // MS)
        count = self.store.add(f"sync/{it}/arrived",
                               1 + (LATE_RANKS if late_ms else 0) + late_ms * LATE_MS)
        if count % RANKS == self.world:
            late_ranks, late_total_ms = count // RANKS % LATE_RANKS, count // LATE_MS
            if late_ranks:
                self.margin_ns += 2 * late_total_ms * MS // late_ranks
            start = time.time_ns() + self.margin_ns
            self.store.set(f"sync/{it}/start", f"{start} {self.margin_ns}")
        work = StoreWait(self.store, f"sync/{it}/start")
        await_start(work)
        if work.value is None:  # a filler that did not wait through the work object
            work.wait()
        start, self.margin_ns = (int(x) for x in work.value.split())
        self.late_ns = max(0, time.time_ns() - start)
        return start


# how long a rank waits for the controller to release an iteration before it fails the cell
GATE_TIMEOUT_S = 60.0


def controller_gate(it: int) -> None:
    """With a controller in the loop (``TESTBED_CONTROLLER_GATE``: the directory where the
    runner's controller marks each iteration it has set the links for, see
    ``testbed.runner.controller``), wait before agreeing on iteration ``it``'s start until the
    controller has released it (file ``controller-gate-<it>``), so that its rates are in force
    before the iteration starts. Iteration 0's rates are set before the ranks start. A no-op
    without a controller. Raises RuntimeError after ``GATE_TIMEOUT_S``."""
    gate = os.environ.get("TESTBED_CONTROLLER_GATE")
    if not gate or it == 0:
        return
    path = Path(gate) / f"controller-gate-{it}"
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the link controller did not release iteration {it} within "
                               f"{GATE_TIMEOUT_S:g} s")
        time.sleep(0.0005)
