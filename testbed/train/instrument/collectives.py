"""The program's all-reduces, seen from outside: ``torch.distributed.all_reduce`` is wrapped
(in ``torch.distributed`` and ``distributed_c10d``, before the program runs) so every call is
recorded with its start, its end and the tensor's bytes: a ``collective`` record
(``testbed.traceformat``). A blocking call's time is the time the rank stood still for it (a
DiLoCo outer sync's stall). ``async_op=True`` returns at once: its record holds the call only
(``blocking`` false), and the readout does not count it as a stall.
"""
from __future__ import annotations

from typing import Callable

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

# record(t0, t1, bytes, blocking)
Record = Callable[[int, int, int, bool], None]


def patch_all_reduce(record: Record, stamp: Callable[[], int]) -> None:
    """Wrap ``all_reduce`` once per process; ``stamp`` gives now (after the GPU's queued work)."""
    original = c10d.all_reduce
    if getattr(original, "_testbed_patched", False):  # torch's own wrappers have __wrapped__
        return

    def all_reduce(tensor, *args, **kwargs):
        t0 = stamp()
        work = original(tensor, *args, **kwargs)
        record(t0, stamp(), tensor.numel() * tensor.element_size(), work is None)
        return work

    all_reduce.__wrapped__ = original
    all_reduce._testbed_patched = True
    all_reduce.__doc__ = original.__doc__
    c10d.all_reduce = all_reduce
    dist.all_reduce = all_reduce
