"""Every path inside a cell directory, in one place.

``results/<experiment>/<run-id>/cells/<cell-id>[-r<repeat>]/`` holds::

    cell.json              the cell file (testbed.cell.cellfile)
    trace-rank<R>.jsonl    rank R's trace (testbed.traceformat)
    iterations.csv         the per-iteration series (testbed.readout.series)
    worker-rank<R>.log     rank R's stdout and stderr
    rank<R>/               a program's working directory on rank R (what it writes lands here)
    error-rank<R>.json     a program's error, written by torch's ``@record`` (if it uses it)
    trace.json             the Perfetto timeline of all ranks
    steps.json             time-varying link steps as applied
    net/                   the network's own records (delay-line configs and logs, lab.json)

On a lab host the run directory holds the same names (cell.json, trace-rank<R>.jsonl), so the
same object names both sides (``CellDir(PurePosixPath(remote_dir))``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePath

TRACE_GLOB = "trace-rank*.jsonl"
ITERATIONS_CSV = "iterations.csv"



@dataclass(frozen=True)
class CellDir:
    """The layout of one cell directory rooted at ``root`` (nothing is created by naming)."""

    root: PurePath

    @property
    def cell_file(self) -> PurePath:
        return self.root / "cell.json"

    def trace(self, rank: int) -> PurePath:
        return self.root / f"trace-rank{rank}.jsonl"

    def worker_log(self, rank: int) -> PurePath:
        return self.root / f"worker-rank{rank}.log"

    def rank_dir(self, rank: int) -> PurePath:
        """Rank ``rank``'s own working directory (programs only)."""
        return self.root / f"rank{rank}"

    def error_file(self, rank: int) -> PurePath:
        return self.root / f"error-rank{rank}.json"

    def traces(self) -> list[Path]:
        """The trace files present, by rank (local cell directories only)."""
        return sorted(Path(self.root).glob(TRACE_GLOB), key=lambda p: int(p.stem[10:]))

    @property
    def iterations(self) -> PurePath:
        return self.root / ITERATIONS_CSV

    @property
    def perfetto(self) -> PurePath:
        return self.root / "trace.json"

    @property
    def steps(self) -> PurePath:
        return self.root / "steps.json"

    @property
    def net(self) -> PurePath:
        return self.root / "net"

    def make(self) -> "CellDir":
        """Create the directory (local cell directories only); returns self."""
        Path(self.root).mkdir(parents=True, exist_ok=True)
        return self
