"""Run a workload's ranks as local processes over loopback (no emulated network).

For tests, benchmarks and quick checks of a schedule; the runner launches the same worker,
with the same cell file, environment and argv, inside the emulated network instead.
"""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from testbed.launch.celldir import CellDir
from testbed.launch.cellfile import CellFile, single_host_placement
from testbed.launch.command import RankJob, worker_argv, worker_env
from testbed.launch.supervise import start_logged, stop_process, watch_workers
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
              schedule: Schedule | None = None) -> None:
    """Start every rank, wait for all; raises WorkerError (with the failing rank's last log
    line) on failure or timeout. No process outlives the call."""
    cell = write_cell(w, out, schedule)
    port = free_port()
    d = CellDir(Path(out))
    procs: dict[int, subprocess.Popen] = {}
    try:
        for rank in range(w.world_size):
            # every rank on this one host: local rank = rank (as the cell file's placement)
            job = RankJob(rank, w.world_size, LOOPBACK, port, "lo", timeout_s, rank,
                          w.world_size)
            procs[rank] = start_logged(worker_argv(sys.executable, cell, Path(out), tuple(extra)),
                                       worker_env(job), Path(d.worker_log(rank)))
    except BaseException:
        for p in procs.values():
            stop_process(p)
        raise
    watch_workers(procs, timeout_s, Path(out))
