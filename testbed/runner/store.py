"""The results directory of one run, written so that a crash never loses a finished row.

Layout (``results/<experiment>/<run-id>/``)::

    experiment.yaml      the file as given        resolved.json   every cell, resolved
    results.csv          one row per cell × repeat (rewritten atomically after every cell)
    results.parquet      the same table, when pyarrow is present
    summary.md, plots/   from ``testbed.report.report``
    run.log              the run's log
    cells/<cell-id>/     cell.json, trace-rank*.jsonl, worker-rank*.log, trace.json
"""
from __future__ import annotations

import io
import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.errors import Problem, SpecError, StorageError, writing
from testbed.readout import columns
from testbed.runner.owner import Owner, missing_dirs



def new_run_id() -> str:
    """A sortable, unique run id: UTC time plus 4 random hex digits."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old or the new file, never a torn one.

    Raises StorageError (naming ``path``) when it cannot be written, e.g. on a full disk: the
    old file is then as it was and the temporary file is removed."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with writing(path):
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    except StorageError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # never made (a read-only directory): nothing to remove
        raise


def save_figure(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Write a matplotlib figure as a PNG, atomically (a full disk leaves no half image);
    raises StorageError when it cannot be written."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    atomic_write(path, buf.getvalue())
    return path


@dataclass
class RunStore:
    """One run directory: rows in memory mirrored to results.csv after every change. Under
    sudo, what it writes is given to the user who ran sudo (``owner``, see
    ``testbed.runner.owner``): the table and each row's cell directory as they are written,
    the rest by ``hand_over``."""

    root: Path
    experiment: str
    run_id: str
    rows: list[dict[str, Any]]
    owner: Owner | None = field(default_factory=Owner.from_sudo)

    @classmethod
    def create(cls, results_root: Path, experiment_name: str, source: Path) -> "RunStore":
        """Make ``results_root/<experiment>/<new run id>/`` and copy the experiment file in;
        raises StorageError when it cannot."""
        run_id = new_run_id()
        root = Path(results_root) / experiment_name / run_id
        made = missing_dirs(root)
        with writing(root, "create"):
            (root / "cells").mkdir(parents=True)
        with writing(root / "experiment.yaml"):
            shutil.copyfile(source, root / "experiment.yaml")
        store = cls(root, experiment_name, run_id, [])
        for d in made:  # the parents this run made are the user's too, not those that were
            store.hand_over(d, recursive=False)
        store.hand_over()
        return store

    @classmethod
    def open(cls, run_dir: Path) -> "RunStore":
        """Reopen an existing run directory (for ``--resume`` and ``report``).

        Raises SpecError when it is not a run directory.
        """
        run_dir = Path(run_dir)
        csv = run_dir / "results.csv"
        if not (run_dir / "experiment.yaml").is_file():
            raise SpecError([Problem(str(run_dir), 0, 0, "", "not a run directory (no "
                                     "experiment.yaml); give results/<experiment>/<run-id>")])
        rows = pd.read_csv(csv).to_dict("records") if csv.is_file() else []
        rows = [{k: _clean(v) for k, v in r.items()} for r in rows]
        return cls(run_dir, run_dir.parent.name, run_dir.name, rows)

    @property
    def csv_path(self) -> Path:
        return self.root / "results.csv"

    def cell_dir(self, cell_id: str, repeat: int) -> Path:
        """The directory for one cell × repeat (created)."""
        d = cell_path(self.root, cell_id, repeat)
        with writing(d, "create"):
            d.mkdir(parents=True, exist_ok=True)
        return d

    def finished(self) -> set[tuple[str, int]]:
        """(cell_id, repeat) pairs that already have an ``ok`` row."""
        return {(r["cell_id"], int(r["repeat"])) for r in self.rows if r.get("status") == "ok"}

    def put(self, row: dict[str, Any]) -> None:
        """Add or replace the row of (cell_id, repeat) and write the table to disk atomically."""
        key = (row["cell_id"], int(row["repeat"]))
        self.rows = [r for r in self.rows if (r["cell_id"], int(r["repeat"])) != key] + [row]
        self.write()
        self.hand_over(cell_path(self.root, *key))

    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame with the contract's column order."""
        df = pd.DataFrame(self.rows)
        return df[columns.ordered(list(df.columns))] if len(df) else df

    def write(self) -> None:
        """Write results.csv (and results.parquet when possible), each atomically."""
        df = self.frame()
        atomic_write(self.csv_path, df.to_csv(index=False).encode())
        self.hand_over(self.csv_path)
        try:
            buf = io.BytesIO()
            df.astype({c: "string" for c in df.columns if df[c].dtype == object}).to_parquet(buf)
            atomic_write(self.root / "results.parquet", buf.getvalue())
            self.hand_over(self.root / "results.parquet")
        except ImportError:
            pass

    def write_json(self, name: str, data: Any) -> None:
        atomic_write(self.root / name, json.dumps(data, indent=2, default=str).encode())
        self.hand_over(self.root / name)

    def hand_over(self, path: Path | None = None, recursive: bool = True) -> None:
        """Under sudo, give ``path`` (default: the whole run directory) and, when
        ``recursive``, everything beneath it to the user who ran sudo; else nothing."""
        if self.owner is not None:
            self.owner.give(self.root if path is None else path, recursive)


def cell_path(run_dir: Path, cell_id: str, repeat: int) -> Path:
    """Where one cell × repeat's directory is inside a run directory."""
    return Path(run_dir) / "cells" / (cell_id if repeat == 0 else f"{cell_id}-r{repeat}")


def _clean(v: Any) -> Any:
    return None if isinstance(v, float) and v != v else v
