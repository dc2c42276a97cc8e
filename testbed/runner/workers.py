"""Starting a cell's workers on whatever network the backend built, one launch contract for all:
the cell file is copied where each host sees it, the environment and argv come from
``testbed.launch.command``, and each rank's trace comes back into the cell directory."""
from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from testbed.launch.celldir import CellDir
from testbed.launch.command import MASTER_PORT, RankJob, worker_argv, worker_env
from testbed.launch.supervise import stop_process
from testbed.net.network import Network, Node
from testbed.plan import CellPlan


def start_workers(net: Network, plan: CellPlan, cell_dir: CellDir,
                  stack: ExitStack) -> dict[int, Any]:
    """Start one worker per rank of ``plan`` inside its host; each is stopped when ``stack``
    closes (also on failure). Returns rank → process handle."""
    slots = plan.slots
    master = net.host(slots[0].dc, slots[0].host_index)
    timeout = plan.experiment.timeout_s
    procs: dict[int, Any] = {}
    for slot in slots:
        node = net.host(slot.dc, slot.host_index)
        there = CellDir(net.files_dir(node, Path(cell_dir.root)))
        net.put(node, Path(cell_dir.cell_file), there.cell_file)
        job = RankJob(slot.rank, len(slots), str(master.ip), MASTER_PORT, node.iface, timeout)
        procs[slot.rank] = _start(net, node, job, cell_dir, there, stack)
    return procs


def _start(net: Network, node: Node, job: RankJob, here: CellDir, there: CellDir,
           stack: ExitStack) -> Any:
    log = open(here.worker_log(job.rank), "wb")
    stack.callback(log.close)
    proc = net.start(node, worker_argv(sys.executable, there.cell_file, there.root),
                     worker_env(job), log, outputs=[(there.trace(job.rank),
                                                     Path(here.trace(job.rank)))])
    stack.callback(stop_process, proc)
    return proc
