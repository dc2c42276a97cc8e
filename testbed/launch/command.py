"""A worker's command: its environment and argv, built here for every backend.

Backends only start what this module builds (``Network.start``) and copy files; none of them
names the worker module or an environment variable.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath

WORKER_MODULE = "testbed.train.worker"
MASTER_PORT = 29500


@dataclass(frozen=True)
class RankJob:
    """What one rank is told: torchrun's variables plus the cell's timeout (seconds)."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    iface: str
    timeout_s: float
    local_rank: int = 0
    local_world_size: int = 1


def worker_env(job: RankJob) -> dict[str, str]:
    """The torchrun-compatible environment of one rank (added to the host's own)."""
    return {
        "RANK": str(job.rank), "WORLD_SIZE": str(job.world_size),
        "LOCAL_RANK": str(job.local_rank), "LOCAL_WORLD_SIZE": str(job.local_world_size),
        "MASTER_ADDR": job.master_addr, "MASTER_PORT": str(job.master_port),
        "GLOO_SOCKET_IFNAME": job.iface, "NCCL_SOCKET_IFNAME": job.iface,
        "TESTBED_TIMEOUT_S": str(int(job.timeout_s)),
    }


def worker_argv(python: str, cell_file: PurePath, out_dir: PurePath,
                extra: tuple[str, ...] = ()) -> list[str]:
    """``python -m testbed.train.worker --cell CELL --out DIR [extra…]``."""
    return [python, "-m", WORKER_MODULE, "--cell", str(cell_file), "--out", str(out_dir),
            *extra]
