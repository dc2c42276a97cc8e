"""Run a workload's ranks as local processes over loopback (no emulated network).

For tests, benchmarks and quick checks of a schedule; the runner launches the same worker,
with the same cell file, environment and argv, inside the emulated network instead. A
program's control run (``run_program_local``) is the program as ``torchrun --nproc_per_node
<world>`` would start it on this machine: one node, loopback, torchrun's environment.
"""
from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Callable

from testbed.cell.celldir import CellDir
from testbed.cell.cellfile import CellFile
from testbed.topology import single_host_placement
from testbed.launch.command import (WORKER_MODULE, RankJob, instrument_args, program_argv,
                                    program_env, program_files, remote_argv, worker_args,
                                    worker_env)
from testbed.launch.interpreters import PROGRAM_ENTRY, Interpreters
from testbed.launch.pool import RankPool
from testbed.launch.supervise import start_logged, watch_workers
from testbed.process import ProcessHandle, stop_processes
from testbed.train.zygote import TORCH_EXECUTOR
from testbed.schedule.ir import Schedule
from testbed.spec import Workload

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def write_cell(w: Workload, out: Path, schedule: Schedule | None = None) -> Path:
    """A cell file for ``w`` with every rank on one host, as the runner would write it
    (``schedule``: the planned compute-only schedule, e.g. a ``schedule_file``'s)."""
    d = CellDir(Path(out)).make()
    cell = CellFile(cell_id="local", workload=w,
                    placement=single_host_placement(w.parallel.pp, w.parallel.dp),
                    schedule=None if schedule is None else schedule.to_dict())
    return cell.write(Path(d.cell_file))


def run_local(w: Workload, out: Path, timeout_s: float = 300, extra: list[str] = (),
              schedule: Schedule | None = None, pool: RankPool | None = None) -> None:
    """Start every rank, wait for all; raises WorkerError (with the failing rank's last log
    line) on failure or timeout. No process outlives the call.

    The ranks are forks of one rank interpreter (``RankPool``, as the runner starts them), so
    torch is imported once per call rather than once per rank: the call's own, or ``pool``'s,
    which it leaves running for the next call (as the runner's serves every cell of a sweep;
    a pool whose interpreter died gets a new one)."""
    cell = write_cell(w, out, schedule)
    port = free_port()
    d = CellDir(Path(out))
    own = pool is None
    if own:
        pool = RankPool(sys.executable, warm=(TORCH_EXECUTOR,) if w.executor == "torch" else ())
    procs: dict[int, ProcessHandle] = {}
    try:
        for rank in range(w.world_size):
            # every rank on this one host: local rank = rank (as the cell file's placement);
            # NCCL sees each rank as a node of its own (host_id), joined over loopback's
            # sockets: ranks sharing one GPU work, and no P2P/SHM path is used that the
            # emulated network would not have
            job = RankJob(rank, w.world_size, LOOPBACK, port, "lo", timeout_s, rank,
                          w.world_size, host_id=f"loopback-{rank}")
            procs[rank] = pool.start(None, WORKER_MODULE,
                                     worker_args(cell, Path(out), tuple(extra)),
                                     worker_env(job), Path(d.worker_log(rank)))
        watch_workers(procs, timeout_s, Path(out))
    finally:
        stop_processes(list(procs.values()))  # ended already, unless the wait was interrupted
        if own:
            pool.close()


def run_program_local(w: Workload, out: Path, timeout_s: float,
                      finished: Callable[[], set[int]] | None = None,
                      interpreters: Interpreters | None = None) -> dict[int, str]:
    """Run ``w``'s program on every rank over loopback, each rank in its own working
    directory under ``out`` (traces and logs in ``out``, as in a cell directory); waits as
    the runner does (``watch_workers``, with ``finished``) and returns what ranks did at exit
    when not a clean 0. A ``python …`` program is forked from ``interpreters``' program
    interpreter when given, as the runner forks it (unless its ``start`` is ``process``).
    Raises WorkerError on failure or timeout."""
    cell = write_cell(w, out)
    d, port, world = CellDir(Path(out)), free_port(), w.world_size
    files = {n: f.resolve() for n, f in program_files(w.program.argv, w.program.files,
                                                      w.base_dir).items()}
    argv = remote_argv(program_argv(sys.executable, w.program.argv, cell, Path(out)), files)
    args = instrument_args(argv, sys.executable) if w.program.start == "fork" else None
    procs: dict[int, ProcessHandle] = {}
    try:
        for rank in range(world):
            job = RankJob(rank, world, LOOPBACK, port, "lo", timeout_s, rank, world,
                          machine_ranks=world, run_id="control")
            work = Path(d.rank_dir(rank))
            work.mkdir(parents=True, exist_ok=True)
            env, log = program_env(job, w.program.env, cell, Path(out)), Path(d.worker_log(rank))
            if interpreters is not None and args is not None:
                procs[rank] = interpreters.for_program(env).start(
                    None, PROGRAM_ENTRY, args, env, log, cwd=work, fresh=True)
            else:
                procs[rank] = start_logged(argv, env, log, cwd=work)
    except BaseException:
        stop_processes(list(procs.values()))
        raise
    return watch_workers(procs, timeout_s, Path(out), finished=finished)
