"""The pre-started interpreters of one sweep on this machine: the built-in worker's, and one for
users' programs (``workload.program.start: fork``, the default).

A ``python …`` program under torchrun is a new interpreter per rank, and each imports torch:
seconds of CPU per rank, paid by every rank of every cell at once on the box that emulates
them all. Here one interpreter imports the instrument (and so torch and ``torch.optim``, as a
new instrument process does before it runs the program) and forks each rank, made to look like
a new interpreter (``testbed.train.zygote``): its environment is the one it would have been
started with, ``sys.path[0]`` its working directory, Python's signal settings, ``random``
seeded anew.

What a fork cannot give a rank is what an interpreter reads from its environment while it
starts: Python's own ``PYTHON*`` variables and what native libraries read when loaded
(OpenMP's ``OMP_*``/``GOMP_*``/``KMP_*``, MKL, OpenBLAS, the dynamic loader's ``LD_*``,
glibc's ``MALLOC_*``, torch's ``TORCH_*``). So the program interpreter is started with the
ranks' values of exactly those (``startup_env``); ranks whose values differ get an interpreter
of their own, and those that serve no rank of the cell end (a sweep over
``program.env.OMP_NUM_THREADS`` starts one per value). Python's hash seed is the interpreter's: forked ranks share one, where torchrun's
would each draw their own (a program whose ranks iterate a ``set`` of strings in different
orders under torchrun agrees with itself here; docs/howto/program.md says so).
"""
from __future__ import annotations

import os
from typing import Iterable

from testbed.launch.command import INSTRUMENT_MODULE
from testbed.launch.pool import RankPool
from testbed.spec.workload import Workload
from testbed.train.zygote import TORCH_EXECUTOR

PROGRAM_ENTRY = f"{INSTRUMENT_MODULE}.__main__"
# variables an interpreter, or a library it loads, reads while it starts (see the docstring)
STARTUP_PREFIXES = ("PYTHON", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "LD_", "MALLOC_",
                    "TORCH_")


def uses_torch_executor(workloads: Iterable[Workload]) -> bool:
    """Whether any of ``workloads`` runs the built-in worker with torch's schedules
    (``executor: torch``), which import ``torch.distributed.pipelining``."""
    return any(w.program is None and w.executor == "torch" for w in workloads)


def startup_env(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` read while an interpreter starts (``STARTUP_PREFIXES``)."""
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES)}


class Interpreters:
    """The built-in worker's pre-started interpreter (``worker``) and the program one for the
    start-up environment in use. ``begin_cell`` forgets which served the cell before;
    ``check_alive`` watches those that serve this one. A context manager: closing ends all.

    ``torch_executor``: some cell runs the built-in worker with ``executor: torch``, so its
    interpreter also imports ``torch.distributed.pipelining`` before it forks (its start-up
    took a median 2.24 s of CPU with it, 1.27 s without: results/leads/worker-imports/);
    otherwise a rank that needs it would import it itself."""

    def __init__(self, python: str, torch_executor: bool = False):
        self.python = python
        self.worker = RankPool(python, warm=(TORCH_EXECUTOR,) if torch_executor else ())
        self._programs: dict[tuple[tuple[str, str], ...], RankPool] = {}
        self._serving: list[RankPool] = []

    def __enter__(self) -> "Interpreters":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def begin_cell(self) -> None:
        self._serving = []

    def for_worker(self) -> RankPool:
        """The built-in worker's interpreter, now serving the cell."""
        return self._serve(self.worker)

    def for_program(self, env: dict[str, str]) -> RankPool:
        """The program interpreter whose start-up environment is that of a rank started with
        ``env`` added to this process's environment, now serving the cell; a new one when none
        has it (those that serve no rank of this cell then end)."""
        wanted = startup_env(env)
        key = tuple(sorted(startup_env({**os.environ, **wanted}).items()))
        if key not in self._programs:
            for old in [k for k, pool in self._programs.items() if pool not in self._serving]:
                self._programs.pop(old).close()
            self._programs[key] = RankPool(self.python, warm=(), entries=(PROGRAM_ENTRY,),
                                           env=wanted)
        return self._serve(self._programs[key])

    def _serve(self, pool: RankPool) -> RankPool:
        if pool not in self._serving:
            self._serving.append(pool)
        return pool

    def check_alive(self) -> None:
        """Raises the WorkerError naming an interpreter serving this cell that died."""
        for pool in self._serving:
            pool.check_alive()

    def close(self) -> None:
        """End every interpreter (and any rank still running in it)."""
        self.worker.close()
        for pool in self._programs.values():
            pool.close()
        self._programs.clear()
