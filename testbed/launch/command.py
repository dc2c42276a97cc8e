"""A worker's command: its environment and argv, built here for every backend.

Backends only start what this module builds (``Network.start``) and copy files; none of them
names the worker module or an environment variable.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePath

from testbed.errors import WorkerError

WORKER_MODULE = "testbed.train.worker"
MASTER_PORT = 29500


@dataclass(frozen=True)
class RankJob:
    """What one rank is told: torchrun's variables plus the cell's timeout (seconds), and the
    GPU it may use (``cuda_device``; None on a host without GPUs: CUDA_VISIBLE_DEVICES is then
    left as the host has it)."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    iface: str
    timeout_s: float
    local_rank: int = 0
    local_world_size: int = 1
    cuda_device: int | None = None


def worker_env(job: RankJob) -> dict[str, str]:
    """The torchrun-compatible environment of one rank (added to the host's own), with
    CUDA_VISIBLE_DEVICES when the rank was given a GPU."""
    env = {
        "RANK": str(job.rank), "WORLD_SIZE": str(job.world_size),
        "LOCAL_RANK": str(job.local_rank), "LOCAL_WORLD_SIZE": str(job.local_world_size),
        "MASTER_ADDR": job.master_addr, "MASTER_PORT": str(job.master_port),
        "GLOO_SOCKET_IFNAME": job.iface, "NCCL_SOCKET_IFNAME": job.iface,
        "TESTBED_TIMEOUT_S": str(int(job.timeout_s)),
    }
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


def program_env(job: RankJob, env: dict[str, str], cell_file: PurePath,
                out_dir: PurePath) -> dict[str, str]:
    """The program's own ``env``, then the torchrun-compatible variables (which win), then
    TESTBED_CELL and TESTBED_OUT (the cell file and where traces go)."""
    return {**env, **worker_env(job), "TESTBED_CELL": str(cell_file),
            "TESTBED_OUT": str(out_dir)}


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
