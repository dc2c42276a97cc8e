"""The cell file (``cell.json``): what the runner hands every worker of one cell.

One typed model, written by the runner (or the loopback launcher) and read by the worker:
the cell's identity, the workload, where each rank runs and the planned compute-only schedule.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from testbed.errors import TestbedError
from testbed.schedule.ir import Schedule
from testbed.spec import Workload


class CellFileError(TestbedError):
    """A cell file that cannot be read or does not describe a runnable cell."""


@dataclass(frozen=True)
class Slot:
    """Where one rank runs: its global rank (dp_rank × pp + pp_rank), its pipeline and
    data-parallel ranks, the DC and host index within that DC, and its rank among the ranks
    of that host (``LOCAL_RANK``; 0 with one rank per host, and in cell files written before
    ``workload.ranks_per_host`` existed)."""

    rank: int
    pp_rank: int
    dp_rank: int
    dc: str
    host_index: int
    local_rank: int = 0

    @property
    def host(self) -> tuple[str, int]:
        """(DC, host index): the host this rank shares with its other local ranks."""
        return self.dc, self.host_index


def local_world_sizes(slots: list[Slot]) -> dict[tuple[str, int], int]:
    """How many ranks each used host runs (``LOCAL_WORLD_SIZE``), keyed by ``Slot.host``."""
    out: dict[tuple[str, int], int] = {}
    for s in slots:
        out[s.host] = out.get(s.host, 0) + 1
    return out


class CellFile(BaseModel):
    """The contents of ``cell.json``. ``schedule`` is ``Schedule.to_dict()`` of the planned
    compute-only schedule (None: the worker generates the workload's standard schedule)."""

    model_config = ConfigDict(extra="forbid")

    cell_id: str
    run_id: str = ""
    repeat: int = 0
    params: dict[str, Any] = {}
    workload: Workload
    placement: list[Slot]
    schedule: dict[str, Any] | None = None

    def planned_schedule(self) -> Schedule | None:
        """The planned schedule, or None when the cell carries none."""
        return None if self.schedule is None else Schedule.from_dict(self.schedule)

    def slot_of(self, rank: int) -> Slot:
        """The slot of global rank ``rank``; raises CellFileError when it has none."""
        slot = next((s for s in self.placement if s.rank == rank), None)
        if slot is None:
            raise CellFileError(f"rank {rank} is not in the cell's placement")
        return slot

    def write(self, path: Path) -> Path:
        """Write the file (JSON, indented); returns ``path``."""
        path.write_text(self.model_dump_json(indent=2), encoding="utf-8")
        return path

    @classmethod
    def read(cls, path: Path) -> "CellFile":
        """Read and validate a cell file; raises CellFileError saying what is wrong."""
        try:
            return cls.model_validate(json.loads(Path(path).read_text(encoding="utf-8")))
        except OSError as e:
            raise CellFileError(f"cannot read cell {path}: {e.strerror}") from None
        except (ValueError, ValidationError) as e:
            first = str(e).strip().splitlines()
            raise CellFileError(f"cell {path} is not a cell file: "
                                f"{' '.join(first[:3])}") from None


def single_host_placement(pp: int, dp: int, dc: str = "local") -> list[Slot]:
    """Every rank of a pp × dp job on one host (loopback runs); local rank = global rank."""
    return [Slot(d * pp + s, s, d, dc, 0, d * pp + s) for d in range(dp) for s in range(pp)]
