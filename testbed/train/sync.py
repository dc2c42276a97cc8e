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

import time

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


def store_round_trip_ns(store: dist.Store, tries: int = 3) -> int:
    """The slowest of ``tries`` reads of a set key: this rank's round trip to the store."""
    store.set("sync/probe", b"1")
    worst = 0
    for _ in range(tries):
        t0 = time.monotonic_ns()
        store.get("sync/probe")
        worst = max(worst, time.monotonic_ns() - t0)
    return worst


def agree_on_start(store: dist.Store, it: int, world: int, margin_ns: int,
                   await_start=lambda work: work.wait()) -> int:
    """The start time (``time.time_ns``) of iteration ``it``, the same on every rank; returns
    once every rank has called it. ``await_start`` waits for the start time to be set (a
    filler may fill that wait)."""
    if store.add(f"sync/{it}/arrived", 1) == world:
        store.set(f"sync/{it}/start", str(time.time_ns() + margin_ns))
    work = StoreWait(store, f"sync/{it}/start")
    await_start(work)
    if work.value is None:  # a filler that did not wait through the work object
        work.wait()
    return int(work.value)
