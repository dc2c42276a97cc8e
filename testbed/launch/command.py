"""A worker's command: its environment and argv, built here for every backend.

Backends only start what this module builds (``Network.start``) and copy files; none of them
names the worker module or an environment variable.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePath

from testbed.errors import WorkerError
from testbed.cell.celldir import CellDir

WORKER_MODULE = "testbed.train.worker"
MASTER_PORT = 29500


@dataclass(frozen=True)
class RankJob:
    """What one rank is told: torchrun's variables plus the cell's timeout (seconds), and the
    GPU it may use (``cuda_device``; None on a host without GPUs: CUDA_VISIBLE_DEVICES is then
    left as the host has it).

    ``group_rank``/``group_world_size`` are the rank's host among the cell's hosts (torchrun's
    node rank and node count); ``machine_ranks`` is how many of the cell's ranks share the
    machine this rank runs on (the emulated hosts of one box share its cores), which decides
    OMP_NUM_THREADS as torchrun's ``--nproc_per_node`` does; ``run_id`` names the cell.
    ``host_id`` is the emulated host's identity for NCCL (``nccl_env``); ``rdma_allowed``
    lets NCCL use InfiniBand/RoCE (``workload.unshaped_rdma`` on a host that has it)."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    iface: str
    timeout_s: float
    local_rank: int = 0
    local_world_size: int = 1
    cuda_device: int | None = None
    group_rank: int = 0
    group_world_size: int = 1
    machine_ranks: int = 1
    run_id: str = "none"
    host_id: str = ""
    rdma_allowed: bool = False


@dataclass(frozen=True)
class Command:
    """What one rank runs: argv, added environment, working directory (None: inherited)."""

    argv: list[str]
    env: dict[str, str]
    cwd: PurePath | None = None


# what torchrun (torch.distributed.run, torch 2.13) gives every worker besides its identity;
# each is a default: a value the user sets is kept, as torchrun keeps one already set
TORCHRUN_DEFAULTS = {
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_MAX_RESTARTS": "0",
    "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}


def torchrun_env(job: RankJob) -> tuple[dict[str, str], dict[str, str]]:
    """torchrun's environment for one rank, as (defaults, identity): the defaults yield to a
    value set by the user (``program.env``), the identity never does.

    OMP_NUM_THREADS=1 is among the defaults where several ranks share a machine: torchrun
    sets it for ``--nproc_per_node`` > 1, and emulated hosts on one box share its cores.
    TORCHELASTIC_USE_AGENT_STORE is False: no torchrun agent hosts the store, rank 0 does
    (``init_process_group`` starts it, as under torchrun's static rendezvous)."""
    defaults = {**TORCHRUN_DEFAULTS, **NCCL_LOG_DEFAULTS}
    if job.machine_ranks > 1:
        defaults["OMP_NUM_THREADS"] = "1"
    identity = {
        "RANK": str(job.rank), "WORLD_SIZE": str(job.world_size),
        "LOCAL_RANK": str(job.local_rank), "LOCAL_WORLD_SIZE": str(job.local_world_size),
        "GROUP_RANK": str(job.group_rank), "GROUP_WORLD_SIZE": str(job.group_world_size),
        "ROLE_NAME": "default", "ROLE_RANK": str(job.rank),
        "ROLE_WORLD_SIZE": str(job.world_size),
        "MASTER_ADDR": job.master_addr, "MASTER_PORT": str(job.master_port),
        "TORCHELASTIC_RUN_ID": job.run_id, "TORCHELASTIC_USE_AGENT_STORE": "False",
    }
    return defaults, identity


def worker_env(job: RankJob) -> dict[str, str]:
    """The environment of one rank (added to the host's own): torchrun's (``torchrun_env``),
    the interfaces gloo and NCCL use, the cell's timeout, and CUDA_VISIBLE_DEVICES where the
    rank was given a GPU."""
    defaults, identity = torchrun_env(job)
    return {**defaults, **identity, **_testbed_env(job)}


# NCCL's own log at INFO, with the lines that name each connection's transport (INIT) and
# the network it chose (NET): the row reads them (testbed.readout.nccl); a user's value wins
NCCL_LOG_DEFAULTS = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}


def nccl_env(job: RankJob) -> dict[str, str]:
    """What NCCL is told on one rank, whatever the program.

    NCCL takes ranks with the same host hash for one node and moves their data over P2P,
    NVLink or shared memory; the hash is the hostname and boot id, which a network namespace
    changes neither of. ``NCCL_HOSTID`` (the emulated host's identity) replaces it, so ranks
    of one emulated host keep P2P and SHM while ranks of different ones are separate nodes,
    joined by the socket transport on ``NCCL_SOCKET_IFNAME``, the emulated interface.
    ``NCCL_IB_DISABLE=1`` keeps NCCL off InfiniBand/RoCE, whose traffic bypasses tc (RDMA
    devices are shared by every namespace), unless the rank may use it (``rdma_allowed``)."""
    env = {"NCCL_SOCKET_IFNAME": job.iface}
    if job.host_id:
        env["NCCL_HOSTID"] = job.host_id
    if not job.rdma_allowed:
        env["NCCL_IB_DISABLE"] = "1"
    return env


def _testbed_env(job: RankJob) -> dict[str, str]:
    env = {"GLOO_SOCKET_IFNAME": job.iface, **nccl_env(job),
           "TESTBED_TIMEOUT_S": str(int(job.timeout_s))}
    if job.cuda_device is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(job.cuda_device)
    return env


def cuda_device(host: str, local_rank: int, local_world_size: int, gpus: int) -> int | None:
    """The GPU of a host's rank ``local_rank``: GPU ``local_rank`` where the host has ``gpus``
    > 0, None where it has none. Raises WorkerError when the host has GPUs but fewer than the
    ranks placed on it (they would share GPUs and measure each other)."""
    if gpus <= 0:
        return None
    if local_world_size > gpus:
        raise WorkerError(f"host {host} has {gpus} GPU(s) for {local_world_size} ranks: lower "
                          f"workload.ranks_per_host to {gpus} or fewer")
    return local_rank


def worker_args(cell_file: PurePath, out_dir: PurePath, extra: tuple[str, ...] = ()
                ) -> list[str]:
    """The worker's arguments: ``--cell CELL --out DIR [extra…]``."""
    return ["--cell", str(cell_file), "--out", str(out_dir), *extra]


def worker_argv(python: str, cell_file: PurePath, out_dir: PurePath,
                extra: tuple[str, ...] = ()) -> list[str]:
    """``python -m testbed.train.worker --cell CELL --out DIR [extra…]``."""
    return [python, "-m", WORKER_MODULE, *worker_args(cell_file, out_dir, extra)]


# ---------------------------------------------------------------- your own program

INSTRUMENT_MODULE = "testbed.train.instrument"
PYTHON = "python"  # as a program's argv[0]: the interpreter testbed runs under


def program_argv(python: str, argv: list[str], cell_file: PurePath,
                 out_dir: PurePath) -> list[str]:
    """A program's command on one rank. ``python …`` runs under the instrument
    (``python -m testbed.train.instrument --cell CELL --out DIR -- …``), which traces
    torch.distributed.pipelining from outside; any other command runs as given."""
    if argv[0] != PYTHON:
        return list(argv)
    return [python, "-m", INSTRUMENT_MODULE, "--cell", str(cell_file), "--out", str(out_dir),
            "--", *argv[1:]]


def instrument_args(argv: list[str], python: str) -> list[str] | None:
    """The instrument's arguments when ``argv`` (a ``Command``'s) runs a program under it
    (``program_argv``'s form, files already placed), else None."""
    head = [python, "-m", INSTRUMENT_MODULE]
    return list(argv[len(head):]) if argv[:len(head)] == head else None


def program_env(job: RankJob, env: dict[str, str], cell_file: PurePath,
                out_dir: PurePath) -> dict[str, str]:
    """What torchrun would give the program on its host: torchrun's defaults, overridden by
    the program's own ``env``, then the rank's identity and testbed's variables (which win):
    the interfaces, TORCHELASTIC_ERROR_FILE (where a program decorated with torch's
    ``@record`` writes its error), TESTBED_CELL and TESTBED_OUT (the cell file and where
    traces go)."""
    defaults, identity = torchrun_env(job)
    return {**defaults, **env, **identity, **_testbed_env(job),
            "TORCHELASTIC_ERROR_FILE": str(CellDir(out_dir).error_file(job.rank)),
            "TESTBED_CELL": str(cell_file), "TESTBED_OUT": str(out_dir)}


def program_files(argv: list[str], files: list[str], base_dir: Path) -> dict[str, Path]:
    """The local files a program names: each argv entry that is a file relative to
    ``base_dir`` (the experiment file's directory), and every entry of ``files``; keyed by
    how the program names them."""
    out = {}
    for name in [*argv[1:], *files]:
        path = base_dir / name
        if not name.startswith("-") and path.is_file():
            out[name] = path
    return out


def remote_argv(argv: list[str], placed: dict[str, PurePath]) -> list[str]:
    """``argv`` with each file it names replaced by where that file was copied."""
    return [str(placed.get(a, a)) for a in argv]
