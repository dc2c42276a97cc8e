"""The program's all-reduces, seen from outside: ``torch.distributed.all_reduce`` is wrapped
(in ``torch.distributed`` and ``distributed_c10d``, before the program runs) so every call is
recorded with its start, its end and the tensor's bytes: a ``collective`` record
(``testbed.traceformat``). A blocking call's time is the time the rank stood still for it (a
DiLoCo outer sync's stall). ``async_op=True`` returns at once: its record holds the call
(``blocking`` false), and the work it returns is wrapped so that its ``wait()`` is recorded
too, as an ``op`` "wait" record (blocking, no bytes): that is where such a rank stands still.
"""
from __future__ import annotations

from typing import Callable

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

# record(t0, t1, bytes, blocking, op)
Record = Callable[[int, int, int, bool, str], None]


class TimedWork:
    """An ``async_op=True`` all-reduce's work as the program gets it: the same work (every
    attribute is the wrapped one's), whose ``wait()`` is recorded."""

    def __init__(self, work, record: Record, stamp: Callable[[], int]):
        self._work, self._record, self._stamp = work, record, stamp

    def wait(self, *args, **kwargs):
        t0 = self._stamp()
        out = self._work.wait(*args, **kwargs)
        self._record(t0, self._stamp(), 0, True, "wait")
        return out

    def __getattr__(self, name):
        return getattr(self._work, name)


def patch_all_reduce(record: Record, stamp: Callable[[], int]) -> None:
    """Wrap ``all_reduce`` once per process; ``stamp`` gives now (after the GPU's queued work)."""
    original = c10d.all_reduce
    if getattr(original, "_testbed_patched", False):  # torch's own wrappers have __wrapped__
        return

    def all_reduce(tensor, *args, **kwargs):
        t0 = stamp()
        work = original(tensor, *args, **kwargs)
        record(t0, stamp(), tensor.numel() * tensor.element_size(), work is None, "all_reduce")
        return work if work is None else TimedWork(work, record, stamp)

    all_reduce.__wrapped__ = original
    all_reduce._testbed_patched = True
    all_reduce.__doc__ = original.__doc__
    c10d.all_reduce = all_reduce
    dist.all_reduce = all_reduce
