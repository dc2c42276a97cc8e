"""Tracing a user's program from outside:
``python -m testbed.train.instrument --cell CELL --out DIR -- SCRIPT [ARGS…]`` (or ``-- -m
MODULE [ARGS…]``) runs the program unmodified (``runpy``, as ``python SCRIPT`` would) after
patching torch.distributed.pipelining (torch 2.13, pinned):

- every ``PipelineStage``'s ``forward_one_chunk`` / ``backward_one_chunk`` /
  ``backward_weight_one_chunk`` → ``compute`` records F, B or I, W (stage, microbatch);
- the schedules' ``_wait_batch_p2p`` → ``wait`` records (P2P_WAIT): time blocked on transfers;
- each schedule's ``step()`` → one ``iter`` record (the first ``workload.warmup`` are warm-up).

The trace (``DIR/trace-rank<RANK>.jsonl``, ``testbed.traceformat``) is written only when the
program ran a pipelining step or called :func:`iteration`; otherwise nothing is, and the
runner falls back to ``program.iteration_regex`` or the wall time.

A program that does not use pipelining reports its iterations with one call after each
training step::

    from testbed.train.instrument import iteration; iteration()

(each call ends an iteration begun at the previous call, the first at program start; a no-op
when the program runs outside testbed). The program's exit status is this process's.
"""
from __future__ import annotations

import argparse
import os
import runpy
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch
from torch.distributed.pipelining import schedules as S
from torch.distributed.pipelining.stage import _PipelineStageBase

from testbed.launch.cellfile import CellFile, CellFileError
from testbed.train.trace import Tracer

_ACTIVE: "Instrument | None" = None


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
            self._trace().action(self.it, kind, stage, mb, t0, time.monotonic_ns(), cat)

    def iteration_done(self, t0: int) -> None:
        """Record iteration ``self.it`` from ``t0`` to now and start the next."""
        t1 = time.monotonic_ns()
        tr = self._trace()
        tr.record(type="iter", iter=self.it, warmup=self.it < self.warmup, t0=t0, t1=t1,
                  loss=None)
        tr.flush()
        self.it, self.mark = self.it + 1, t1

    def end(self, status: str, error: str | None) -> None:
        if self.tracer is not None:
            self.tracer.end(status, error)


def iteration() -> None:
    """Mark the end of one training iteration (programs that do not use pipelining)."""
    if _ACTIVE is not None:
        _ACTIVE.iteration_done(_ACTIVE.mark)


# ---------------------------------------------------------------- patches


def _timed(kind: Callable[[dict], str], method: Callable) -> Callable:
    def wrapper(stage, chunk_id, *args, **kwargs):
        t0 = time.monotonic_ns()
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
        ins.depth += 1
        t0 = time.monotonic_ns()
        try:
            return method(self, *args, **kwargs)
        finally:
            ins.depth -= 1
            ins.iteration_done(t0)
    step.__wrapped__ = method
    return step


def _wait(original: Callable) -> Callable:
    def wait(work):
        t0 = time.monotonic_ns()
        original(work)
        if _ACTIVE is not None:
            _ACTIVE.action("P2P_WAIT", None, None, t0, "wait")
    wait.__wrapped__ = original
    return wait


def install(ins: Instrument) -> None:
    """Patch torch's pipelining classes (once per process) so ``ins`` sees every step."""
    global _ACTIVE
    _ACTIVE = ins
    base = _PipelineStageBase
    if hasattr(base.forward_one_chunk, "__wrapped__"):
        return
    base.forward_one_chunk = _timed(lambda kw: "F", base.forward_one_chunk)
    base.backward_one_chunk = _timed(lambda kw: "B" if kw.get("full_backward", True) else "I",
                                     base.backward_one_chunk)
    base.backward_weight_one_chunk = _timed(lambda kw: "W", base.backward_weight_one_chunk)
    S._wait_batch_p2p = _wait(S._wait_batch_p2p)
    for cls in _schedule_classes():
        cls.step = _step(cls.__dict__["step"])


def _schedule_classes() -> list[type]:
    todo, out = [S._PipelineSchedule], []
    while todo:
        cls = todo.pop()
        if "step" in cls.__dict__:
            out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


# ---------------------------------------------------------------- running the program


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m testbed.train.instrument",
                                 description="run a program with torch.distributed.pipelining "
                                             "traced from outside")
    ap.add_argument("--cell", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("program", nargs=argparse.REMAINDER,
                    help="-- SCRIPT [ARGS…] or -- -m MODULE [ARGS…]")
    args = ap.parse_args(argv)
    args.program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not args.program or args.program == ["-m"]:
        ap.error("give the program after --: SCRIPT [ARGS…] or -m MODULE [ARGS…]")
    return args


def _run(program: list[str]) -> None:
    """Run ``program`` as ``python PROGRAM…`` would: sys.argv, sys.path[0], __main__."""
    if program[0] == "-m":
        sys.argv = program[1:]
        runpy.run_module(program[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(program)
        sys.path.insert(0, str(Path(program[0]).resolve().parent))
        runpy.run_path(program[0], run_name="__main__")


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        cell = CellFile.read(args.cell)
    except CellFileError as e:
        print(f"instrument: {e}", file=sys.stderr)
        return 2
    w = cell.workload
    ins = Instrument(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                     args.out, w.warmup, w.schedule if w.schedule_known else "program")
    install(ins)
    return _finish(ins, args.program)


def _finish(ins: Instrument, program: list[str]) -> int:
    """Run the program; the trace ends ok on exit status 0, else with the error."""
    try:
        _run(program)
        status: Any = 0
    except SystemExit as e:
        status = e.code
    except BaseException as e:  # noqa: BLE001 — the program's own failure, reported as python would
        traceback.print_exc()
        ins.end("error", f"{type(e).__name__}: {e}")
        return 1
    code = status if isinstance(status, int) else (0 if status is None else 1)
    if isinstance(status, str):
        print(status, file=sys.stderr)
    ins.end("ok" if code == 0 else "error", None if code == 0 else f"exit status {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
