"""Tracing a user's program from outside:
``python -m testbed.train.instrument --cell CELL --out DIR -- SCRIPT [ARGS…]`` (or ``-- -m
MODULE [ARGS…]``) runs the program unmodified (``runpy``, as ``python SCRIPT`` would) after
patching torch.distributed.pipelining (torch 2.13, pinned). On CUDA every stamp is taken
once the rank's current stream has finished what was queued (``stamp``):

- every ``PipelineStage``'s ``forward_one_chunk`` / ``backward_one_chunk`` /
  ``backward_weight_one_chunk`` → ``compute`` records F, B or I, W (stage, microbatch);
- the schedules' ``_wait_batch_p2p`` → ``wait`` records (P2P_WAIT): time blocked on transfers;
- each schedule's ``step()`` → one ``iter`` record (the first ``workload.warmup`` are warm-up);
- every optimizer's ``step()`` → one ``opt`` record (torch's global post-step hook), naming
  which optimizer: the iterations of a program that neither pipelines nor marks them;
- every ``torch.distributed.all_reduce`` → one ``collective`` record (``collectives``): the
  program's gradient or pseudo-gradient syncs, wherever it calls them.

The trace (``DIR/trace-rank<RANK>.jsonl``, ``testbed.traceformat``) is written only when the
program ran a pipelining step, an optimizer step or called :func:`iteration`; otherwise
nothing is, and the runner falls back to ``program.iteration_regex`` or the wall time.

A program that does not use pipelining reports its iterations with one call after each
training step::

    from testbed.train.instrument import iteration; iteration()

(each call ends an iteration begun at the previous call, the first at program start; a no-op
when the program runs outside testbed). The program's exit status is this process's. The
command line is ``testbed.train.instrument.__main__``; the state lives here, in the one module
instance the program imports too.
"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Callable

# the environment as the launcher gave it, before torch is imported (torch sets variables of
# its own, e.g. TORCHINDUCTOR_CACHE_DIR): the program starts with this one, as under torchrun
ENV_AT_START = dict(os.environ)

import torch  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: E402

from testbed.train.instrument.collectives import patch_all_reduce  # noqa: E402
from testbed.train.instrument.onimport import after_import  # noqa: E402
from testbed.train.trace import Tracer  # noqa: E402

PIPELINING = "torch.distributed.pipelining"

_ACTIVE: "Instrument | None" = None


def stamp() -> int:
    """Now (monotonic ns), once this rank's GPU work so far is done: a program on CUDA queues
    its kernels and transfers and returns at once, so each stamp first waits for the current
    CUDA stream (a no-op for a program that never touched CUDA)."""
    if torch.cuda.is_initialized():
        torch.cuda.current_stream().synchronize()
    return time.monotonic_ns()


class Instrument:
    """One rank's trace of a program: created lazily at the first step or ``iteration()``."""

    def __init__(self, rank: int, world: int, out_dir: Path, warmup: int, schedule: str):
        self.rank, self.world, self.out_dir = rank, world, Path(out_dir)
        self.warmup, self.schedule = warmup, schedule
        self.tracer: Tracer | None = None
        self.it = 0
        self.depth = 0  # nested step() calls (a subclass calling its parent) count once
        self.stages: set[int] = set()
        self.mark = time.monotonic_ns()
        self.optimizers: dict[int, int] = {}  # id(optimizer) → its index, in first-step order

    def _trace(self) -> Tracer:
        if self.tracer is None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self.tracer = Tracer(self.out_dir / f"trace-rank{self.rank}.jsonl")
            self.tracer.record(type="meta", rank=self.rank, world_size=self.world,
                               pp_rank=self.rank, dp_rank=0, stages=sorted(self.stages),
                               schedule=self.schedule, executor="program",
                               compute_mode="real", host=socket.gethostname(),
                               torch_version=torch.__version__, clock="monotonic")
        return self.tracer

    def action(self, kind: str, stage: int | None, mb: int | None, t0: int, cat: str) -> None:
        if self.depth:  # only inside a step: outside work is no part of an iteration
            self._trace().action(self.it, kind, stage, mb, t0, stamp(), cat)

    def iteration_done(self, t0: int) -> None:
        """Record iteration ``self.it`` from ``t0`` to now and start the next."""
        t1 = stamp()
        tr = self._trace()
        tr.record(type="iter", iter=self.it, warmup=self.it < self.warmup, t0=t0, t1=t1,
                  loss=None)
        tr.flush()
        self.it, self.mark = self.it + 1, t1

    def collective(self, t0: int, t1: int, nbytes: int, blocking: bool,
                   op: str = "all_reduce") -> None:
        """Record one ``all_reduce`` call, or the wait of an async one (``collectives``):
        anywhere in the program, not only inside a step; the readout places it in the
        iteration it falls in. Not flushed here (a program may call it per tensor): the next
        optimizer step or the trace's end does."""
        self._trace().record(type="collective", op=op, t0=t0, t1=t1, bytes=nbytes,
                             blocking=blocking)

    def optimizer_step(self, optimizer=None) -> None:
        """Record that an optimizer finished a step (``opt``: its end on this rank's clock):
        for a program that neither pipelines nor marks its iterations, each such step ends
        one (``testbed.readout.traces.iterations_from_optimizer``). Steps inside a pipelining
        step or between marks are recorded too; the readout uses them only without ``iter``
        records."""
        tr = self._trace()
        # which optimizer: a DiLoCo program's outer optimizer steps once per H inner steps,
        # and only the one that steps most ends iterations (testbed.readout.traces)
        key = id(optimizer)
        if key not in self.optimizers:
            self.optimizers[key] = len(self.optimizers)
        tr.record(type="opt", t=stamp(), opt=self.optimizers[key])
        tr.flush()

    def end(self, status: str, error: str | None) -> None:
        """Close the trace. A failure is recorded even without one (an ``end`` record alone),
        so the runner can tell which rank failed first."""
        if self.tracer is None and status != "ok":
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self.tracer = Tracer(self.out_dir / f"trace-rank{self.rank}.jsonl")
        if self.tracer is not None:
            self.tracer.end(status, error)


def iteration() -> None:
    """Mark the end of one training iteration (programs that do not use pipelining)."""
    if _ACTIVE is not None:
        _ACTIVE.iteration_done(_ACTIVE.mark)


# ---------------------------------------------------------------- patches


def _timed(kind: Callable[[dict], str], method: Callable) -> Callable:
    def wrapper(stage, chunk_id, *args, **kwargs):
        t0 = stamp()
        out = method(stage, chunk_id, *args, **kwargs)
        if _ACTIVE is not None:
            _ACTIVE.stages.add(stage.stage_index)
            _ACTIVE.action(kind(kwargs), stage.stage_index, chunk_id, t0, "compute")
        return out
    wrapper.__wrapped__ = method
    return wrapper


def _step(method: Callable) -> Callable:
    def step(self, *args, **kwargs):
        ins = _ACTIVE
        if ins is None or ins.depth:
            return method(self, *args, **kwargs)
        if ins.tracer is None:  # the trace's meta names the schedule class and its stages
            ins.schedule = type(self).__name__
            stages = getattr(self, "_stages", None) or [getattr(self, "_stage", None)]
            ins.stages.update(st.stage_index for st in stages if st is not None)
        ins.depth += 1
        t0 = stamp()
        try:
            return method(self, *args, **kwargs)
        finally:
            ins.depth -= 1
            ins.iteration_done(t0)
    step.__wrapped__ = method
    return step


def _wait(original: Callable) -> Callable:
    def wait(work):
        t0 = stamp()
        original(work)
        if _ACTIVE is not None:
            _ACTIVE.action("P2P_WAIT", None, None, t0, "wait")
    wait.__wrapped__ = original
    return wait


def _optimizer_stepped(optimizer, args, kwargs) -> None:
    if _ACTIVE is not None:
        _ACTIVE.optimizer_step(optimizer)


def _all_reduced(t0: int, t1: int, nbytes: int, blocking: bool, op: str) -> None:
    if _ACTIVE is not None:
        _ACTIVE.collective(t0, t1, nbytes, blocking, op)


def install(ins: Instrument) -> None:
    """Make ``ins`` the one that records: hook every optimizer's step (torch's global
    post-step hook) and patch torch's pipelining classes once the program imports them
    (``onimport``: importing them first changes the program). Once per process."""
    global _ACTIVE
    first = _ACTIVE is None
    _ACTIVE = ins
    if first:
        register_optimizer_step_post_hook(_optimizer_stepped)
        patch_all_reduce(_all_reduced, stamp)
        after_import(PIPELINING, _patch_pipelining)


def _patch_pipelining() -> None:
    """Patch every stage's compute, the schedules' P2P waits and every schedule's step."""
    from torch.distributed.pipelining import schedules as S
    from torch.distributed.pipelining.stage import _PipelineStageBase as base
    if hasattr(base.forward_one_chunk, "__wrapped__"):
        return
    base.forward_one_chunk = _timed(lambda kw: "F", base.forward_one_chunk)
    base.backward_one_chunk = _timed(lambda kw: "B" if kw.get("full_backward", True) else "I",
                                     base.backward_one_chunk)
    base.backward_weight_one_chunk = _timed(lambda kw: "W", base.backward_weight_one_chunk)
    S._wait_batch_p2p = _wait(S._wait_batch_p2p)
    for cls in _schedule_classes(S._PipelineSchedule):
        cls.step = _step(cls.__dict__["step"])


def _schedule_classes(root: type) -> list[type]:
    todo, out = [root], []
    while todo:
        cls = todo.pop()
        if "step" in cls.__dict__:
            out.append(cls)
        todo.extend(cls.__subclasses__())
    return out
