"""One pipeline rank: ``python -m testbed.train.worker --cell CELL.json --out DIR``.

Reads the cell (workload and placement) written by the runner, joins the process group with
the torchrun-style environment it is given (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
GLOO_SOCKET_IFNAME, TESTBED_TIMEOUT_S), runs the warm-up and measured iterations and writes
``DIR/trace-rank<RANK>.jsonl``. Exit status 0 on success; otherwise the last line on stderr is a
one-line error (the runner records it) and the trace ends with an ``error`` record.

Test hook: ``TESTBED_INJECT_FAULT=<rank>:<iteration>[:<cell id>]`` makes that rank raise at the
start of that iteration (of that cell only, if given), so tests can check how a real failure
travels to the results.
"""
from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from testbed.cell.cellfile import CellFile, CellFileError
from testbed.schedule.generators import generate
from testbed.schedule.lower import lower
from testbed.schedule.registry import CROSS_DC_SCHEDULES
from testbed.spec.workload import shared_gpu_problem
from testbed.train import nccl
from testbed.train.executor import Executor
from testbed.train.rank import RankContext
from testbed.train.filler import TAIL, Filler, NoFiller
from testbed.train.sync import (StartSync, controller_gate, default_store,
                                 store_round_trip_ns)
from testbed.train.trace import Tracer
from testbed.train.transport import Transport, connection_groups

DEFAULT_TIMEOUT_S = 600
ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# recorded in the trace's meta record when given (a rank's place on its host)
LOCAL_ENV = ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES")


class WorkerFailure(Exception):
    """A problem with the worker's input or environment (reported without a traceback)."""


def read_env() -> dict[str, str]:
    missing = [k for k in ENV if not os.environ.get(k)]
    if missing:
        raise WorkerFailure(f"missing environment variables {', '.join(missing)} "
                            "(the runner or torchrun sets them)")
    return {k: os.environ[k] for k in (*ENV, *LOCAL_ENV) if k in os.environ}


def read_cell(path: Path) -> CellFile:
    """The cell file; raises WorkerFailure when it cannot be read."""
    try:
        return CellFile.read(path)
    except CellFileError as e:
        raise WorkerFailure(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="one pipeline-parallel training rank")
    ap.add_argument("--cell", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--trace-actions", choices=("all", "none", "alternate"), default="all",
                    help="record every action (default), none (iterations only), or only in "
                         "even iterations (to measure the tracing overhead within one run)")
    args = ap.parse_args(argv)
    started_ns = time.monotonic_ns()
    tracer = None
    try:
        env = read_env()
        cell = read_cell(args.cell)
        args.out.mkdir(parents=True, exist_ok=True)
        tracer = Tracer(args.out / f"trace-rank{int(env['RANK'])}.jsonl",
                        actions=args.trace_actions != "none")
        run(cell, env, tracer, alternate=args.trace_actions == "alternate",
            started_ns=started_ns)
        tracer.end("ok", None)
        return 0
    except BaseException as e:  # noqa: BLE001 — every failure becomes a one-line report
        message = _one_line(e)
        if tracer is not None:
            tracer.end("error", message, getattr(e, "testbed_failed_at", None))
        if os.environ.get("TESTBED_DEBUG"):
            traceback.print_exc()
        print(f"worker rank {os.environ.get('RANK', '?')}: {message}", file=sys.stderr)
        return 1


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    head = text[0] if text else ""
    if isinstance(e, WorkerFailure):
        return head
    return f"{type(e).__name__}: {head}" if head else type(e).__name__


def run(cell: CellFile, env: dict[str, str], tracer, alternate: bool = False,
        started_ns: int | None = None) -> None:
    """Join the process group, run the cell's iterations on this rank, leave the group."""
    w = cell.workload
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    if world != w.world_size:
        raise WorkerFailure(f"WORLD_SIZE={world} but the workload has pp×dp={w.world_size}")
    try:
        slot = cell.slot_of(rank)
    except CellFileError as e:
        raise WorkerFailure(str(e)) from None
    try:
        backend = nccl.resolve_backend(w.dist_backend)
    except RuntimeError as e:
        raise WorkerFailure(str(e)) from None
    _join(rank, world)
    times = {"started": started_ns, "joined": time.monotonic_ns()}
    filler = NoFiller()
    try:
        ex, filler = _executor(cell, slot, world, tracer, {**times, **_local(env)}, backend)
        ex.warm_up_connections()
        if getattr(ex, "ordered", False):
            pairs = nccl.boundary_pairs(cell.placement, ex.ctx)
            nccl.read_back(ex.transport, pairs, ex.shape, ex.device, tracer)
        _iterate(ex, filler, w, tracer, _injected_fault(rank, cell.cell_id), alternate,
                 cell.start_offsets_s.get(rank, 0.0))
    except BaseException as e:
        # when it failed, before tearing the group down: the runner names the rank whose
        # failure came first, not the peers that lost their connection to it
        e.testbed_failed_at = time.monotonic_ns()
        raise
    finally:
        filler.close()
        dist.destroy_process_group()


def _join(rank: int, world: int) -> None:
    """Join the process group over the environment's MASTER_ADDR/PORT."""
    torch.set_num_threads(1)  # ranks share a few cores; threads would only fight
    timeout = float(os.environ.get("TESTBED_TIMEOUT_S", DEFAULT_TIMEOUT_S))
    # gloo carries CPU tensors; with CUDA present NCCL is registered for CUDA tensors too,
    # which the executor places on the GPU with dist_backend nccl (testbed.train.nccl)
    dist.init_process_group(nccl.process_group_backends(), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))


def _local(env: dict[str, str]) -> dict:
    """What this rank was told about its host: LOCAL_RANK, LOCAL_WORLD_SIZE and its GPU
    (CUDA_VISIBLE_DEVICES, None when not set), as the meta record keeps them."""
    return {"local_rank": int(env.get("LOCAL_RANK", 0)),
            "local_world_size": int(env.get("LOCAL_WORLD_SIZE", 1)),
            "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES")}


def _executor(cell: CellFile, slot, world: int, tracer, info: dict, backend: str = "gloo"):
    """(executor, filler) of this rank, after recording the trace's meta record (``info``:
    when the worker started and joined, monotonic ns, and its place on its host, see
    ``_local``)."""
    w = cell.workload
    pp, dp = w.parallel.pp, w.parallel.dp
    # only this rank's data-parallel group(s), synchronised among their members: a group every
    # rank creates ends in a barrier over all of them, round trips across the slow links; one
    # per workload.connections, over which the all-reduce's chunks are split
    replicas = [d * pp + slot.pp_rank for d in range(dp)]
    dp_groups = [dist.new_group(replicas, use_local_synchronization=True)
                 for _ in range(w.connections)] if dp > 1 else [None]
    dp_group = dp_groups[0]
    schedule = lower(_schedule(cell, w))
    device = nccl.rank_device(backend, info.get("local_rank", 0))
    sharing = info.get("local_world_size", 1)
    if device.type == "cuda" and w.compute.mode == "real" and torch.cuda.device_count() < sharing:
        raise WorkerFailure(shared_gpu_problem(sharing, torch.cuda.device_count()))
    if backend == "nccl" or os.environ.get("TESTBED_ORDERED_TRANSPORT") == "1":
        problems = nccl.order_problems(schedule, pp)
        if problems:
            raise WorkerFailure(f"{w.schedule} sends in another order than it receives, which "
                                f"NCCL cannot match ({problems[0]}): use dist_backend: gloo")
        # TESTBED_ORDERED_TRANSPORT=1 with gloo: this transport on CPU tensors (tests)
        transport = nccl.NcclTransport()
    else:  # P2P transfers split over workload.connections TCP connections (one group each)
        transport = Transport(connection_groups(w.connections))
    ctx = RankContext(slot.rank, slot.pp_rank, slot.dp_rank, pp, dp, schedule)
    tracer.record(type="meta", rank=slot.rank, world_size=world, pp_rank=ctx.pp_rank,
                  dp_rank=ctx.dp_rank, stages=schedule.stages_of(ctx.pp_rank),
                  schedule=w.schedule, executor=w.executor, compute_mode=w.compute.mode,
                  microbatches=w.microbatches, microbatch_size=w.microbatch_size,
                  connections=w.connections, filler_mode=w.filler_mode,
                  seq_len=w.model.seq_len, host=socket.gethostname(), pid=os.getpid(),
                  ppid=os.getppid(), **info,
                  torch_version=torch.__version__, clock="monotonic",
                  dist_backend=backend, device=str(device))
    if w.executor == "torch":
        # pipelining costs ~1.4 s to import: only here (the zygote warms it, WARMED)
        from testbed.train.torch_executor import TorchExecutor, pipeline_groups
        pipes = pipeline_groups(pp, dp)
        return TorchExecutor(ctx, w, tracer, dp_group, pipes[ctx.dp_rank],
                             placement=cell.placement), NoFiller()
    filler = _make_filler(w, tracer)
    return Executor(ctx, w, tracer, dp_group, transport, filler, cell.placement,
                    Transport(dp_groups), device), filler


def _iterate(ex, filler, w, tracer, fault: int | None, alternate: bool,
             offset_s: float = 0.0) -> None:
    """Every iteration, each started at one instant on every rank (``offset_s`` later on this
    one: wan_sharing temporal), then the closing barrier."""
    store = default_store()
    sync = StartSync(store, dist.get_world_size(), _start_margin_ns(store))
    margin_ms = sync.margin_ns / 1e6
    late = 0
    for it in range(w.iterations):
        if it == fault:
            raise RuntimeError(f"injected fault at iteration {it} (TESTBED_INJECT_FAULT)")
        controller_gate(it)  # a controller in the loop sets the links first
        heard_late = _start_together(sync, it, _tail(filler, it - 1), offset_s)
        late += heard_late if it >= w.warmup else 0  # a skewed warm-up is not measured
        if alternate:
            tracer.actions = it % 2 == 0
        t0 = time.monotonic_ns()
        loss = ex.iteration(it)
        tracer.record(type="iter", iter=it, warmup=it < w.warmup, t0=t0,
                      t1=time.monotonic_ns(), loss=loss)
        tracer.flush()
    _tail(filler, w.iterations - 1)(dist.barrier(async_op=True))
    tracer.record(type="start_sync", margin_ms=margin_ms, final_margin_ms=sync.margin_ns / 1e6,
                  late_starts=late)


def _schedule(cell: CellFile, w):
    """The cell's compute-only schedule: the one the runner planned (``cell.json``), else the
    standard generator's; cross-DC schedules exist only as planned ones."""
    s = cell.planned_schedule()
    if s is not None:
        if (s.name, s.pp, s.microbatches) != (w.schedule, w.parallel.pp, w.microbatches):
            raise WorkerFailure(f"cell.json's schedule is {s.name} for pp={s.pp}, "
                                f"m={s.microbatches}; the workload says {w.schedule}, "
                                f"pp={w.parallel.pp}, m={w.microbatches}")
        return s
    if w.schedule in CROSS_DC_SCHEDULES or w.schedule_file is not None:
        what = w.schedule_file or w.schedule
        raise WorkerFailure(f"{what} is planned into cell.json by the runner: run it through the "
                            "runner (testbed run), which plans it into cell.json")
    return generate(w.schedule, w.parallel.pp, w.microbatches, w.chunks)


def _make_filler(w, tracer):
    """The workload's filler (prefill inside measured idle gaps), or a NoFiller."""
    return NoFiller() if w.filler is None else Filler(w.filler, w.filler_mode, tracer, w.seed)


def _tail(filler, it: int):
    """How to wait for the barrier after iteration ``it``: the gap there (this rank done, a
    later one still working) is filled like any other; a plain wait before the first
    iteration (no gap has been measured, and start-up skew is not a bubble)."""
    if it < 0:
        return lambda work: work.wait()
    return lambda work: filler.wait(it, TAIL, work, time.monotonic_ns())


def _start_margin_ns(store) -> int:
    """The first guess of how far ahead of the last rank's arrival the common start is set:
    three times this rank's round trip to the store plus 2 ms (a rank as far from the store
    hears of it two round trips after: tests/train/test_start_sync.py). Only the last rank to
    arrive at the first sync uses it; a rank that hears of a start too late widens the margin
    at the next sync (testbed.train.sync), which is still the warm-up when there is one."""
    return store_round_trip_ns(store) * 3 + 2_000_000


def _start_together(sync: StartSync, it: int, await_start=lambda work: work.wait(),
                    offset_s: float = 0.0) -> int:
    """Start iteration ``it`` on every rank at the same instant. A barrier alone releases
    ranks up to two one-way delays apart across a slow link, and the late ones would count as
    pipeline bubble; so once every rank has arrived the last of them sets a start time a
    margin ahead (wall clock: shared by the namespaces of one machine, NTP-synchronised across
    lab hosts) and everyone sleeps until then (see testbed.train.sync: the margin widens when
    a rank was late). Returns 1 if this rank heard of it too late (the start is skewed).
    ``await_start`` waits for the start time (the filler fills that wait)."""
    start = sync.agree(it, await_start)
    wait = (start - time.time_ns()) / 1e9
    if wait + offset_s > 0:
        time.sleep(wait + offset_s)
    return int(wait < 0)


def _injected_fault(rank: int, cell_id: str) -> int | None:
    spec = os.environ.get("TESTBED_INJECT_FAULT", "")
    if not spec:
        return None
    r, it, *cell = spec.split(":")
    if int(r) != rank or (cell and cell[0] != cell_id):
        return None
    return int(it)


if __name__ == "__main__":
    sys.exit(main())
