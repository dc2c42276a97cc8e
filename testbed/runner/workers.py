"""Starting a cell's workers on whatever network the backend built, one launch contract for all:
the cell file is copied where each host sees it, the environment and argv come from
``testbed.launch.command``, and each rank's trace comes back into the cell directory.

With ``workload.program`` each rank runs that program instead of the built-in worker: in the
experiment file's directory where the host sees this machine's files, else in the host's run
directory, where the files the program names have been copied (and its argv points at them).
"""
from __future__ import annotations

import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from testbed.errors import WorkerError, writing
from testbed.launch.celldir import CellDir
from testbed.launch.cellfile import Slot, local_world_sizes
from testbed.launch.command import (MASTER_PORT, WORKER_MODULE, RankJob, cuda_device,
                                    program_argv, program_env, program_files, remote_argv,
                                    worker_args, worker_argv, worker_env)
from testbed.launch.pool import RankPool
from testbed.launch.supervise import stop_process
from testbed.net.network import Network, Node
from testbed.plan import CellPlan


@dataclass(frozen=True)
class Command:
    """What one rank runs: argv, added environment, working directory (None: inherited)."""

    argv: list[str]
    env: dict[str, str]
    cwd: PurePath | None = None


def start_workers(net: Network, plan: CellPlan, cell_dir: CellDir, stack: ExitStack,
                  pool: RankPool | None = None) -> dict[int, Any]:
    """Start one worker (or the workload's program) per rank of ``plan`` inside its host (the
    ranks of one host share it and its run directory, into which files are copied once); each
    is stopped when ``stack`` closes (also on failure). Built-in workers on hosts of this
    machine are forked from ``pool`` when given (see testbed.launch.pool). Returns rank →
    process handle; raises WorkerError (before any rank starts) when a host has fewer GPUs
    than ranks."""
    slots = plan.slots
    jobs = {s.rank: rank_job(net, s, slots, plan.experiment.timeout_s) for s in slots}
    copied: set[Node] = set()
    procs: dict[int, Any] = {}
    for slot in slots:
        node = net.host(*slot.host)
        there = CellDir(net.files_dir(node, Path(cell_dir.root)))
        first = node not in copied  # a second copy could rewrite a file a rank is reading
        if first:
            net.put(node, Path(cell_dir.cell_file), there.cell_file)
            copied.add(node)
        command = _command(net, node, plan, jobs[slot.rank], cell_dir, there, first)
        if pool is not None and _poolable(net, node, plan, cell_dir, there):
            procs[slot.rank] = _fork(pool, net, node, jobs[slot.rank], cell_dir, there,
                                     command.env, stack)
        else:
            procs[slot.rank] = _start(net, node, jobs[slot.rank], command, cell_dir, there,
                                      stack)
    return procs


def rank_job(net: Network, slot: Slot, slots: list[Slot], timeout_s: float) -> RankJob:
    """What ``slot``'s rank is told: rank 0's host is the master; LOCAL_RANK and
    LOCAL_WORLD_SIZE from the ranks sharing its host; its GPU where the host has GPUs
    (``Network.gpu_count``). Raises WorkerError when a host has fewer GPUs than ranks."""
    node, master = net.host(*slot.host), net.host(*slots[0].host)
    local = local_world_sizes(slots)[slot.host]
    return RankJob(slot.rank, len(slots), str(master.ip), MASTER_PORT, node.iface, timeout_s,
                   slot.local_rank, local,
                   cuda_device(node.name, slot.local_rank, local, net.gpu_count(node)))


def _poolable(net: Network, node: Node, plan: CellPlan, here: CellDir, there: CellDir) -> bool:
    """A built-in worker on a host of this machine (it sees the cell directory as it is)."""
    return (plan.experiment.workload.program is None and there.root == here.root
            and net.netns_file(node) is not None)


def _fork(pool: RankPool, net: Network, node: Node, job: RankJob, here: CellDir,
          there: CellDir, env: dict[str, str], stack: ExitStack) -> Any:
    rank = pool.start(net.netns_file(node), WORKER_MODULE,
                      worker_args(there.cell_file, there.root), env,
                      here.worker_log(job.rank))
    net.ledger.add_process(rank.pid)  # `clean` stops it if this process dies
    stack.callback(stop_process, rank)
    return rank


def _command(net: Network, node: Node, plan: CellPlan, job: RankJob, here: CellDir,
             there: CellDir, copy: bool = True) -> Command:
    w = plan.experiment.workload
    if w.program is None:
        return Command(worker_argv(sys.executable, there.cell_file, there.root), worker_env(job))
    env = program_env(job, w.program.env, there.cell_file, there.root)
    argv = program_argv(sys.executable, w.program.argv, there.cell_file, there.root)
    if there.root == here.root:  # the host sees this machine's files
        return Command(argv, env, w.base_dir)
    placed = {}
    for name, local in program_files(w.program.argv, w.program.files, w.base_dir).items():
        placed[name] = there.root / local.name
        if copy:  # the host's first rank copies what its ranks share
            net.put(node, local, placed[name])
    return Command(remote_argv(argv, placed), env, there.root)


def _start(net: Network, node: Node, job: RankJob, command: Command, here: CellDir,
           there: CellDir, stack: ExitStack) -> Any:
    with writing(here.worker_log(job.rank), "create"):
        log = open(here.worker_log(job.rank), "wb")
    stack.callback(log.close)
    try:
        proc = net.start(node, command.argv, command.env, log,
                         outputs=[(there.trace(job.rank), Path(here.trace(job.rank)))],
                         cwd=command.cwd)
    except OSError as e:  # a program or working directory that is not there: this cell fails
        raise WorkerError(f"rank {job.rank} could not start {command.argv[0]!r} in "
                          f"{command.cwd or '.'}: {e.strerror}") from None
    stack.callback(stop_process, proc)
    return proc
