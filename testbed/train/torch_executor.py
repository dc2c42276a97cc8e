"""``executor: torch``: the same workload run by torch.distributed.pipelining's own schedules.

Stages are ``PipelineStage`` objects on the pipeline's process group; the schedule classes are
torch's (GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV).
Tracing wraps each stage's ``forward_one_chunk`` / ``backward_one_chunk`` /
``backward_weight_one_chunk`` (pure compute) and torch's ``_wait_batch_p2p`` (communication
waits), as docs/facts.md explains; these are private hooks of torch 2.13 (pinned).

Emulated compute: each stage is a one-parameter module (``x · p``, so autograd has input and
weight gradients to split) and the wrappers sleep the modelled F/B/I/W time around the call.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import schedules as S
from torch.distributed.pipelining.stage import PipelineStage

from testbed.schedule.csvfile import write_csv
from testbed.schedule.ir import Kind, Schedule
from testbed.train.executor import Executor
from testbed.train.rank import RankContext, modelled_ns, modelled_s, ns
from testbed.train.trace import Tracer

SCHEDULE_CLASSES = {
    "gpipe": S.ScheduleGPipe, "1f1b": S.Schedule1F1B,
    "interleaved_1f1b": S.ScheduleInterleaved1F1B, "zb_h1": S.ScheduleInterleavedZeroBubble,
    "zbv": S.ScheduleZBVZeroBubble, "dualpipev": S.ScheduleDualPipeV,
}
SINGLE_STAGE = {"gpipe", "1f1b"}


class Scale(nn.Module):
    """The emulated stage's compute: one learnable scalar."""

    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.p


class TorchExecutor(Executor):
    """Runs iterations through torch's schedule runtime; shares set-up, DP and the optimizer
    step with the project's executor."""

    def __init__(self, ctx: RankContext, w, tracer: Tracer, dp_group: Any | None = None,
                 pipe_group: Any | None = None, placement=None):
        super().__init__(ctx, w, tracer, dp_group, placement=placement)
        self.it = 0
        mods = self.modules if self.real else {s: Scale() for s in self.stages}
        if not self.real:
            self.params = [p for m in mods.values() for p in m.parameters()]
        self.pipe_stages = [PipelineStage(mods[s], s, self.n_stages, torch.device("cpu"),
                                          group=pipe_group) for s in self.stages]
        for st in self.pipe_stages:
            self._wrap(st)
        if w.schedule_file is not None:
            self.schedule = self._from_csv(ctx.schedule, w.microbatches)
        else:
            cls = SCHEDULE_CLASSES[w.schedule]
            arg = self.pipe_stages[0] if w.schedule in SINGLE_STAGE else self.pipe_stages
            self.schedule = cls(arg, w.microbatches, loss_fn=self._loss)
        self.has_first = 0 in self.stages
        self.has_last = self.n_stages - 1 in self.stages

    def warm_up_connections(self) -> None:
        """Nothing: torch's pipeline stages open their own connections."""

    def _from_csv(self, lowered: Schedule, microbatches: int) -> S._PipelineScheduleRuntime:
        """torch's runtime running the cell's own schedule, loaded with its ``_load_csv`` from
        the compute-only CSV of the planned order (what ``schedule_file`` gave)."""
        compute = Schedule(lowered.name, lowered.pp, lowered.n_stages, lowered.microbatches,
                           lowered.stage_to_rank, [[a for a in acts if a.kind.is_compute]
                                                   for acts in lowered.actions])
        runtime = S._PipelineScheduleRuntime(self.pipe_stages, microbatches, loss_fn=self._loss)
        with tempfile.TemporaryDirectory(prefix="testbed-schedule-") as d:
            runtime._load_csv(str(write_csv(compute, Path(d) / "schedule.csv")))
        return runtime

    def _loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.real:
            return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))
        return out.mean()

    # ------------------------------------------------------------------ tracing + emulation
    def _wrap(self, stage: PipelineStage) -> None:
        fwd, bwd, wgt = stage.forward_one_chunk, stage.backward_one_chunk, \
            stage.backward_weight_one_chunk
        s = stage.stage_index

        def forward_one_chunk(chunk_id, *args, **kwargs):
            return self._timed(Kind.F, s, chunk_id, fwd, chunk_id, *args, **kwargs)

        def backward_one_chunk(chunk_id, *args, full_backward=True, **kwargs):
            kind = Kind.B if full_backward else Kind.I
            return self._timed(kind, s, chunk_id, bwd, chunk_id, *args,
                               full_backward=full_backward, **kwargs)

        def backward_weight_one_chunk(chunk_id, *args, **kwargs):
            return self._timed(Kind.W, s, chunk_id, wgt, chunk_id, *args, **kwargs)

        stage.forward_one_chunk = forward_one_chunk
        stage.backward_one_chunk = backward_one_chunk
        stage.backward_weight_one_chunk = backward_weight_one_chunk
        for kind, name in (("SEND_F", "get_fwd_send_ops"), ("SEND_B", "get_bwd_send_ops"),
                           ("RECV_F", "get_fwd_recv_ops"), ("RECV_B", "get_bwd_recv_ops")):
            setattr(stage, name, self._traced_ops(kind, s, getattr(stage, name)))

    def _traced_ops(self, kind: str, stage: int, get_ops):
        """Record each P2P op torch posts (bytes, peer) when the schedule asks for it; the
        transfer itself overlaps compute, its blocking part shows as a ``wait``."""
        def ops(chunk_id):
            out = get_ops(chunk_id)
            t = ns()
            for op in out:
                self.tr.action(self.it, kind, stage, chunk_id, t, t, "comm",
                               op.tensor.numel() * op.tensor.element_size(), op.peer)
            return out
        return ops

    def _timed(self, kind: Kind, stage: int, mb: int, fn, *args, **kwargs):
        t0 = ns()
        out = fn(*args, **kwargs)
        if not self.real:
            time.sleep(modelled_s(self.times[stage], kind))
        t1 = ns()
        self.tr.action(self.it, kind.value, stage, mb, t0, t1, "compute",
                       model_ns=None if self.real else modelled_ns(self.times[stage], kind))
        return out

    # ------------------------------------------------------------------ one iteration
    def iteration(self, it: int) -> float | None:
        self.it = it
        original = S._wait_batch_p2p

        def traced_wait(work):
            t0 = ns()
            original(work)
            self.tr.action(it, "P2P_WAIT", None, None, t0, ns(), "wait")

        S._wait_batch_p2p = traced_wait
        try:
            losses: list = []
            args, kwargs = self._inputs()
            self.schedule.step(*args, losses=losses if self.has_last else None, **kwargs)
        finally:
            S._wait_batch_p2p = original
        self._data_parallel(it)
        if not self.real:
            for p in self.params:
                p.grad = None
        if self.has_last and losses:
            return float(sum(x.item() for x in losses) / len(losses))
        return None

    def _inputs(self) -> tuple[tuple, dict]:
        """The whole batch for the first stage and the target for the last, as step() wants."""
        m, b = self.m, self.w.microbatch_size
        if self.real:
            tokens = self.data.reshape(m * b, -1)
            x, y = tokens[:, :-1], tokens[:, 1:]
        else:
            x = torch.randn(m * b, self.elem // b if self.elem >= b else 1)
            y = torch.zeros(m * b)
        args = (x,) if self.has_first else ()
        kwargs = {"target": y} if self.has_last else {}
        return args, kwargs


def pipeline_groups(pp: int, dp: int) -> list[Any]:
    """One process group per DP replica's pipeline (every rank must create all of them)."""
    if dp == 1:
        return [None]
    return [dist.new_group([d * pp + s for s in range(pp)]) for d in range(dp)]
