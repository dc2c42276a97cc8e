"""The cell file (``cell.json``): what the runner hands every worker of one cell.

One typed model, written by the runner (or the loopback launcher) and read by the worker:
the cell's identity, the workload, where each rank runs and the planned compute-only schedule.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from testbed.errors import TestbedError
from testbed.schedule.ir import Schedule
from testbed.spec import Workload
from testbed.topology import Slot


class CellFileError(TestbedError):
    """A cell file that cannot be read or does not describe a runnable cell."""


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
    # seconds after each iteration's common start at which a rank starts (wan_sharing:
    # temporal, testbed.plan.sharing); ranks not named start at once
    start_offsets_s: dict[int, float] = {}

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

