"""The built-in worker on GPUs: the process-group backend, NCCL's point-to-point transport,
a deadlock-free warm-up and the read-back of one activation across each DC boundary.

NCCL matches a send with a receive by order, not by tag, and runs the operations of one
communicator one after another on one CUDA stream. The executor posts every receive of an
iteration at its start (``Executor._post_receives``); on one stream a receive posted early
would hold back every send behind it. So transfers go over two process groups, ``up`` (to a
higher rank) and ``down`` (to a lower one): torch gives each pair of ranks of a group its own
communicator, so every communicator carries one direction between two ranks, and the only
order that must agree is the sender's sends and the receiver's receives on that direction
(``order_problems`` checks it before the first transfer).

A communicator is created by both its ranks together, blocking, at their first transfer. The
warm-up therefore visits the pairs in one global order, (group, lower rank, higher rank), which
every rank follows, so no rank waits for a peer that waits for a third.

Waiting for a transfer waits for its work and then for this rank's current CUDA stream: the
trace's stamps are taken when the bytes are on the GPU, not when the copy was queued.
"""
from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from testbed.schedule.ir import Kind, Schedule

# read-back round trips per boundary; the median is kept
READBACK_ROUNDS = 5


def resolve_backend(requested: str) -> str:
    """``nccl`` or ``gloo`` for ``workload.dist_backend`` on this rank: auto is nccl where
    CUDA is available. Raises RuntimeError for nccl without CUDA."""
    cuda = torch.cuda.is_available()
    if requested == "auto":
        return "nccl" if cuda else "gloo"
    if requested == "nccl" and not cuda:
        raise RuntimeError("dist_backend: nccl but this rank sees no CUDA device (torch "
                           f"{torch.__version__}, CUDA_VISIBLE_DEVICES as given): use gloo "
                           "or auto")
    return requested


def process_group_backends() -> str:
    """The string ``init_process_group`` gets, whichever backend the transfers use: gloo for
    CPU tensors always, NCCL for CUDA tensors where CUDA exists."""
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def rank_device(backend: str, local_rank: int = 0) -> torch.device:
    """Where this rank's tensors live: with nccl its GPU, ``LOCAL_RANK`` among the GPUs it
    sees (the runner leaves it one through CUDA_VISIBLE_DEVICES; over loopback it sees all
    and several ranks may share one); the CPU with gloo."""
    if backend == "nccl":
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


class StreamTransfer:
    """Pending NCCL works; ``wait`` returns when their bytes are in GPU memory."""

    def __init__(self, works: list[Any]):
        self.works = works

    def wait(self) -> None:
        for w in self.works:
            w.wait()
        if torch.cuda.is_initialized():
            torch.cuda.current_stream().synchronize()

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)


class NcclTransport:
    """isend/irecv of whole tensors, each direction between two ranks on its own communicator
    (group ``up`` to a higher rank, ``down`` to a lower). Tags are not passed: NCCL has none,
    and gloo then matches by order as NCCL does (``TESTBED_ORDERED_TRANSPORT=1`` runs this
    transport over gloo on CPU tensors: how machines without a GPU test it)."""

    connections = 1

    def __init__(self):
        world = list(range(dist.get_world_size()))
        # collective: every rank creates both, in this order
        self.up = dist.new_group(world)
        self.down = dist.new_group(world)

    def group(self, src: int, dst: int):
        return self.up if dst > src else self.down

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> StreamTransfer:
        me = dist.get_rank()
        return StreamTransfer([dist.isend(tensor.contiguous(), dst=dst,
                                          group=self.group(me, dst))])

    def irecv(self, buf: torch.Tensor, src: int, tag: int = 0) -> StreamTransfer:
        me = dist.get_rank()
        return StreamTransfer([dist.irecv(buf, src=src, group=self.group(src, me))])


def warm_up(transport: NcclTransport, peers: list[int], make) -> None:
    """Open the communicator of every direction between this rank and each of ``peers`` with
    one message made by ``make()``, in the global order (group, lower rank, higher rank)."""
    me = dist.get_rank()
    steps = []
    for peer in peers:
        lo, hi = min(me, peer), max(me, peer)
        steps.append((0, lo, hi, lo))  # up: lo → hi
        steps.append((1, lo, hi, hi))  # down: hi → lo
    for _, lo, hi, src in sorted(steps):
        dst = hi if src == lo else lo
        if src == me:
            transport.isend(make(), dst).wait()
        else:
            transport.irecv(make(), src).wait()


def order_problems(schedule: Schedule, pp: int) -> list[str]:
    """Each direction between two pipeline ranks whose sends are issued in another order than
    the receiver posts its receives (NCCL would deliver one transfer's bytes into another's
    buffer); empty when every direction agrees."""
    sent: dict[tuple[int, int], list] = {}
    posted: dict[tuple[int, int], list] = {}
    owner = schedule.stage_to_rank
    for rank, actions in enumerate(schedule.actions):
        for a in actions:
            if a.kind is Kind.SEND_F:
                sent.setdefault((rank, owner[a.stage + 1]), []).append(("F", a.stage, a.microbatch))
            elif a.kind is Kind.SEND_B:
                sent.setdefault((rank, owner[a.stage - 1]), []).append(("B", a.stage - 1, a.microbatch))
            elif a.kind is Kind.RECV_F:
                posted.setdefault((owner[a.stage - 1], rank), []).append(("F", a.stage - 1, a.microbatch))
            elif a.kind is Kind.RECV_B:
                posted.setdefault((owner[a.stage + 1], rank), []).append(("B", a.stage, a.microbatch))
    out = []
    for src, dst in sorted(set(sent) | set(posted)):
        a, b = sent.get((src, dst), []), posted.get((src, dst), [])
        if a != b:
            i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            out.append(f"pipeline rank {src} → {dst}: transfer {i} is sent as "
                       f"{_name(a, i)} but received as {_name(b, i)}")
    return out


def _name(seq: list, i: int) -> str:
    if i >= len(seq):
        return "nothing"
    kind, boundary, mb = seq[i]
    return f"{'activation' if kind == 'F' else 'gradient'} of microbatch {mb} at boundary {boundary}"


def read_back(transport: NcclTransport, pairs: list[tuple[int, int]], shape: tuple[int, ...],
              device: torch.device, tracer) -> None:
    """Time one activation across each DC boundary before the first iteration.

    For each (sender, receiver) in ``pairs`` (global ranks, in the same order on every rank):
    the sender sends one activation of ``shape`` and the receiver answers with one element;
    then both exchange one element each way. The activation's one-way time is the first round
    trip less half the second (the return leg and the fixed costs), each the least of
    ``READBACK_ROUNDS`` rounds: a late wake-up or a late delay-line release only ever adds to a
    round trip, and one that fell on the second made the round's difference too small (a
    suite run beside the netem tests' user-mode kernel read 19.874 ms across a 20 ms link,
    three of its five element round trips 3.4 to 5.3 ms over the link's 40 ms). The sender
    records it (``readback`` record), with each round's difference (``rounds``) and two round
    trips (``round_trips``: [activation out + element back, element each way])."""
    me = dist.get_rank()
    act = torch.zeros(shape, device=device)
    one = torch.zeros(1, device=device)
    for src, dst in pairs:
        if me not in (src, dst):
            continue
        bigs, smalls = [], []
        for _ in range(READBACK_ROUNDS):
            bigs.append(_round_trip(transport, me, src, dst, act, one))
            smalls.append(_round_trip(transport, me, src, dst, one, one))
        times = [big - small / 2 for big, small in zip(bigs, smalls)]
        trips = [[round(big, 6), round(small, 6)] for big, small in zip(bigs, smalls)]
        if me == src:
            seconds = min(bigs) - min(smalls) / 2
            tracer.record(type="readback", peer=dst, bytes=act.numel() * act.element_size(),
                          seconds=seconds, rounds=[round(t, 6) for t in times],
                          round_trips=trips,
                          backend="nccl" if act.is_cuda else "gloo")


def boundary_pairs(placement, ctx) -> list[tuple[int, int]]:
    """(sender, receiver) global ranks of each forward transfer of ``ctx``'s pipeline whose two
    ranks are in different DCs (``placement``: the cell's slots), in stage order: the
    read-back's pairs, the same list on every rank of the pipeline."""
    dc = {s.rank: s.dc for s in placement}
    out = []
    for stage in range(ctx.schedule.n_stages - 1):
        a, b = ctx.global_rank(stage), ctx.global_rank(stage + 1)
        if dc.get(a) != dc.get(b) and (a, b) not in out:
            out.append((a, b))
    return out


def _round_trip(transport, me: int, src: int, dst: int, there: torch.Tensor,
                back: torch.Tensor) -> float:
    """Seconds from sending ``there`` (src → dst) to receiving ``back`` (dst → src), on src;
    on dst the same exchange, untimed (0)."""
    if me == src:
        t0 = time.perf_counter()
        transport.isend(there, dst).wait()
        transport.irecv(back, dst).wait()
        return time.perf_counter() - t0
    transport.irecv(there, src).wait()
    transport.isend(back, src).wait()
    return 0.0
