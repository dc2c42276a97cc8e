"""Starting a cell's workers on whatever network the backend built, one launch contract for all:
the cell file is copied where each host sees it, the environment and argv come from
``testbed.launch.command``, and each rank's trace comes back into the cell directory.

With ``workload.program`` each rank runs that program instead of the built-in worker, with
torchrun's environment, in a working directory of its own per cell (``rank<R>/`` in the cell
directory, on a lab host in its run directory): what a program writes stays with its rank and
cell. The files it names are given by absolute path (on a lab host, copied into that directory
first) and ``program.files`` appear in it under the names the program uses.
"""
from __future__ import annotations

import logging
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Collection

from testbed.cell.celldir import CellDir
from testbed.errors import WorkerError, writing
from testbed.launch.command import (MASTER_PORT, WORKER_MODULE, Command, RankJob,
                                    cuda_device, instrument_args, program_argv, program_env,
                                    program_files, remote_argv, worker_args, worker_argv,
                                    worker_env)
from testbed.launch.interpreters import PROGRAM_ENTRY, Interpreters
from testbed.launch.pool import RankPool
from testbed.launch.rdma import unshaped_rdma_hosts
from testbed.net.network import Network, Node
from testbed.plan import CellPlan
from testbed.spec.workload import shared_gpu_problem
from testbed.process import ProcessHandle, stop_process
from testbed.topology import Slot, local_world_sizes

log = logging.getLogger(__name__)


def start_workers(net: Network, plan: CellPlan, cell_dir: CellDir, stack: ExitStack,
                  interpreters: Interpreters | None = None) -> dict[int, ProcessHandle]:
    """Start one worker (or the workload's program) per rank of ``plan`` inside its host (the
    ranks of one host share it and its run directory); each
    is stopped when ``stack`` closes (also on failure). Ranks on hosts of this machine are
    forked from ``interpreters`` when given: built-in workers always, a ``python …`` program
    unless its ``start`` is ``process`` (see testbed.launch.interpreters). Returns rank →
    process handle; raises WorkerError (before any rank starts) when a host has fewer GPUs
    than ranks, RefusedError when NCCL could reach the other DCs over RDMA, which tc cannot
    shape, and the experiment did not opt in (``testbed.launch.rdma``)."""
    slots = plan.slots
    unshaped = unshaped_rdma_hosts(net, plan)
    _check_gpus_for_nccl(net, plan)
    jobs = {s.rank: rank_job(net, s, slots, plan.experiment.timeout_s,
                             plan.cell.cell_id, unshaped) for s in slots}
    copied: set[Node] = set()
    procs: dict[int, ProcessHandle] = {}
    for slot in slots:
        node = net.host(*slot.host)
        there = CellDir(net.files_dir(node, Path(cell_dir.root)))
        if node not in copied:  # a second copy could rewrite a file a rank is reading
            net.put(node, Path(cell_dir.cell_file), there.cell_file)
            copied.add(node)
        command = _command(net, node, plan, jobs[slot.rank], cell_dir, there)
        fork = _fork_of(interpreters, net, node, plan, command, cell_dir, there)
        if fork is not None:
            procs[slot.rank] = _fork(fork, net, node, jobs[slot.rank], cell_dir, command,
                                     stack)
        else:
            procs[slot.rank] = _start(net, node, jobs[slot.rank], command, cell_dir, there,
                                      stack)
    log.info("cell %s: ranks started, pid by rank: %s", PurePath(cell_dir.root).name,
             " ".join(f"{r}:{p.pid}" for r, p in sorted(procs.items())))
    return procs


def _check_gpus_for_nccl(net: Network, plan: CellPlan) -> None:
    """The built-in worker with ``dist_backend: nccl`` needs a GPU on every host, and with
    real compute one GPU per rank of this machine (``shared_gpu_problem``): raises
    WorkerError before any rank starts."""
    w = plan.experiment.workload
    if w.program is not None or w.dist_backend != "nccl":
        return
    here = 0
    for slot in plan.slots:
        node = net.host(*slot.host)
        if net.gpu_count(node) == 0:
            raise WorkerError(f"dist_backend: nccl but host {node.name} has no GPU (no "
                              "/dev/nvidia<N>): use dist_backend: auto or gloo")
        here += net.netns_file(node) is not None
    gpus = net.gpu_count(net.host(*plan.slots[0].host))
    if w.compute.mode == "real" and here > gpus:
        raise WorkerError(shared_gpu_problem(here, gpus))


def rank_job(net: Network, slot: Slot, slots: list[Slot], timeout_s: float,
             run_id: str = "none", rdma_hosts: Collection[str] = ()) -> RankJob:
    """What ``slot``'s rank is told: rank 0's host is the master; LOCAL_RANK and
    LOCAL_WORLD_SIZE from the ranks sharing its host, GROUP_RANK from its host's place among
    the cell's hosts; how many ranks share its machine (every host with a namespace here
    shares this one); its GPU where the host has GPUs (``Network.gpu_count``: on a lab host its
    local rank, on this machine its place among this machine's ranks); whether NCCL may use
    RDMA (its host is one of ``rdma_hosts``, those opted in: ``unshaped_rdma_hosts``). Raises
    WorkerError when a host has fewer GPUs than ranks."""
    node, master = net.host(*slot.host), net.host(*slots[0].host)
    local = local_world_sizes(slots)
    here = [s for s in slots if net.netns_file(net.host(*s.host)) is not None]
    on_this_machine = net.netns_file(node) is not None
    machine = len(here) if on_this_machine else local[slot.host]
    gpus = net.gpu_count(node)
    gpu = cuda_device(node.name, slot.local_rank, local[slot.host], gpus)
    if gpu is not None and on_this_machine:
        # emulated hosts of one box share its GPUs: the ranks of this machine take them in
        # rank order (one each while they last, then round again: ranks share a GPU)
        gpu = here.index(slot) % gpus
    return RankJob(slot.rank, len(slots), str(master.ip), MASTER_PORT, node.iface, timeout_s,
                   slot.local_rank, local[slot.host], gpu,
                   group_rank=list(local).index(slot.host), group_world_size=len(local),
                   machine_ranks=machine, run_id=run_id,
                   host_id=f"{run_id}-{node.name}", rdma_allowed=node.name in rdma_hosts)


@dataclass(frozen=True)
class _Fork:
    """How a rank is forked: from which interpreter, which entry module with which
    arguments, and whether made to look like a new interpreter (a program)."""

    pool: RankPool
    module: str
    args: list[str]
    fresh: bool


def _fork_of(interpreters: Interpreters | None, net: Network, node: Node, plan: CellPlan,
             command: Command, here: CellDir, there: CellDir) -> _Fork | None:
    """How the rank is forked, or None where it starts as a process of its own: a host not of
    this machine (or one that sees the cell directory elsewhere), a program that is not
    ``python …`` or whose ``start`` is ``process``."""
    if interpreters is None or there.root != here.root or net.netns_file(node) is None:
        return None
    program = plan.experiment.workload.program
    if program is None:
        return _Fork(interpreters.for_worker(), WORKER_MODULE,
                     worker_args(there.cell_file, there.root), False)
    args = instrument_args(command.argv, sys.executable)
    if program.start != "fork" or args is None:
        return None
    return _Fork(interpreters.for_program(command.env), PROGRAM_ENTRY, args, True)


def _fork(fork: _Fork, net: Network, node: Node, job: RankJob, here: CellDir,
          command: Command, stack: ExitStack) -> ProcessHandle:
    rank = fork.pool.start(net.netns_file(node), fork.module, fork.args, command.env,
                           here.worker_log(job.rank), cwd=command.cwd, fresh=fork.fresh)
    net.ledger.add_process(rank.pid)  # `clean` stops it if this process dies
    stack.callback(stop_process, rank)
    return rank


def _command(net: Network, node: Node, plan: CellPlan, job: RankJob, here: CellDir,
             there: CellDir) -> Command:
    """The built-in worker's command, or the program's: it runs in a working directory of its
    own per rank and cell (``CellDir.rank_dir``), with the files it names given by absolute
    path (copied first where the host does not see this machine's files)."""
    w = plan.experiment.workload
    if w.program is None:
        env = worker_env(job)
        if plan.experiment.controller is not None:  # ranks wait for it between iterations
            env["TESTBED_CONTROLLER_GATE"] = str(there.root)
        return Command(worker_argv(sys.executable, there.cell_file, there.root), env)
    env = program_env(job, w.program.env, there.cell_file, there.root)
    env["TESTBED_EXPERIMENT_DIR"] = str(w.base_dir)
    argv = program_argv(sys.executable, w.program.argv, there.cell_file, there.root)
    files = program_files(w.program.argv, w.program.files, w.base_dir)
    workdir = there.rank_dir(job.rank)
    if there.root == here.root:  # the host sees this machine's files
        _link_files(Path(workdir), w.program.files, w.base_dir)
        return Command(remote_argv(argv, {n: p.resolve() for n, p in files.items()}), env,
                       workdir)
    net.run(node, ["mkdir", "-p", str(workdir)])
    placed = {name: workdir / PurePath(name).name if PurePath(name).is_absolute()
              else workdir / name for name in files}
    for name, local in files.items():  # each rank its own copy, in its own directory
        net.put(node, local, placed[name])
    return Command(remote_argv(argv, placed), env, workdir)


def _link_files(workdir: Path, names: list[str], base_dir: Path) -> None:
    """Make ``workdir`` and link each of ``program.files`` into it under the name the program
    uses (relative to the experiment file's directory; an absolute path under its file name),
    so it finds them as it did there. Raises StorageError when that cannot be written."""
    with writing(workdir, "create"):
        workdir.mkdir(parents=True, exist_ok=True)
        for name in names:
            link = workdir / (name if not PurePath(name).is_absolute() else PurePath(name).name)
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.symlink_to((base_dir / name).resolve())


def _start(net: Network, node: Node, job: RankJob, command: Command, here: CellDir,
           there: CellDir, stack: ExitStack) -> ProcessHandle:
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
