"""Point-to-point transfers split over several TCP connections (Atlas-style).

One TCP connection across a high-RTT link moves at most its window per round trip; the window
is capped by the socket buffer limit (``topology.tcp_buffer_max_mb``). Gloo opens its own TCP
connection per pair of ranks in every process group, so N process groups over all ranks give N
parallel connections between any two ranks. A transfer is cut into N contiguous chunks of the
flattened tensor; chunk i travels on group i with the transfer's own tag. Gloo matches a
message by (source, tag) within its group, so chunks of different transfers never mix, and the
receiver's chunks land directly in views of its buffer (no copy).

With one connection this is exactly ``dist.isend``/``dist.irecv`` on the default group.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def connection_groups(n: int) -> list[Any]:
    """The process groups a transfer is spread over: the default group, then ``n - 1`` new
    groups over every rank. Collective: every rank must call it with the same ``n`` at the
    same point of its group creation order."""
    return [None] + [dist.new_group(list(range(dist.get_world_size()))) for _ in range(n - 1)]


def chunks(tensor: torch.Tensor, n: int) -> list[torch.Tensor]:
    """``tensor`` (contiguous) as at most ``n`` contiguous, non-empty views of its elements,
    the same cut on sender and receiver for equal sizes."""
    flat = tensor.view(-1)
    return list(torch.tensor_split(flat, min(n, max(1, flat.numel()))))


class Transfer:
    """The pending chunks of one send or receive; ``wait`` completes all of them."""

    def __init__(self, works: list[Any]):
        self.works = works

    def wait(self) -> None:
        for w in self.works:
            w.wait()


class Transport:
    """isend/irecv of whole tensors over ``groups`` (one chunk per group)."""

    def __init__(self, groups: list[Any] | None = None):
        self.groups = groups or [None]

    @property
    def connections(self) -> int:
        return len(self.groups)

    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Transfer:
        parts = chunks(tensor.contiguous(), len(self.groups))
        return Transfer([dist.isend(p, dst=dst, tag=tag, group=g)
                         for p, g in zip(parts, self.groups)])

    def irecv(self, buf: torch.Tensor, src: int, tag: int) -> Transfer:
        if not buf.is_contiguous():
            raise ValueError("receive buffers must be contiguous (chunks are views of them)")
        parts = chunks(buf, len(self.groups))
        return Transfer([dist.irecv(p, src=src, tag=tag, group=g)
                         for p, g in zip(parts, self.groups)])

