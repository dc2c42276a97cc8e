"""Run a workload's ranks as local processes over loopback (no emulated network).

For tests, benchmarks and quick checks of a schedule; the runner launches the same worker
inside the emulated network instead.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from testbed.spec import Workload
from testbed.train.watch import stop_process, watch_workers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_cell(w: Workload, out: Path) -> Path:
    """A cell.json for ``w`` with every rank on one host, as the runner would write it."""
    pp = w.parallel.pp
    placement = [{"rank": d * pp + s, "pp_rank": s, "dp_rank": d, "dc": "local",
                  "host_index": 0} for d in range(w.parallel.dp) for s in range(pp)]
    out.mkdir(parents=True, exist_ok=True)
    path = out / "cell.json"
    path.write_text(json.dumps({"cell_id": "local", "workload": w.model_dump(mode="json"),
                                "placement": placement}), encoding="utf-8")
    return path


def run_local(w: Workload, out: Path, timeout_s: float = 300, extra: list[str] = ()) -> None:
    """Start every rank, wait for all; raises WorkerError (with the failing rank's last log
    line) on failure or timeout. No process outlives the call."""
    cell = write_cell(w, out)
    port = free_port()
    procs: dict[int, subprocess.Popen] = {}
    try:
        for rank in range(w.world_size):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(w.world_size),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK="0",
                       TESTBED_TIMEOUT_S=str(int(timeout_s)))
            log = open(out / f"worker-rank{rank}.log", "wb")
            procs[rank] = subprocess.Popen(
                [sys.executable, "-m", "testbed.train.worker", "--cell", str(cell),
                 "--out", str(out), *extra], env=env, stdout=log, stderr=log)
            log.close()
    except BaseException:
        for p in procs.values():
            stop_process(p)
        raise
    watch_workers(procs, timeout_s, out)
