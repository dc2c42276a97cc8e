"""``--save`` for every benchmark: what the benchmark prints is kept in
``results/benchmarks/<name>.md`` (headed by the command that wrote it, when and where) and its
table rows in ``results/benchmarks/<name>.csv``, so that every figure the README and docs/ quote has
a committed file and a command behind it.

    with saved("bench_x", args.save) as out:
        ...print the tables...
        out.rows(rows)          # list of dicts: the CSV
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import io
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Iterator

OUT_DIR = Path(__file__).resolve().parents[1] / "results" / "benchmarks"


def add_save(ap: argparse.ArgumentParser) -> None:
    """The ``--save`` flag."""
    ap.add_argument("--save", action="store_true",
                    help=f"also write the output to {OUT_DIR.relative_to(OUT_DIR.parents[1])}"
                         "/<name>.md and its table to <name>.csv")


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, s: str) -> int:
        for st in self.streams:
            st.write(s)
        return len(s)

    def flush(self) -> None:
        for st in self.streams:
            st.flush()

    def isatty(self) -> bool:
        return False


class Saved:
    """Collects the CSV rows while the benchmark prints."""

    def __init__(self) -> None:
        self._rows: list[dict] = []

    def rows(self, rows: list[dict]) -> None:
        self._rows += rows


def _interpreter() -> str:
    """How the header names the Python that ran: the project's .venv, or the one found on the
    PATH (a lent GPU machine's own, say)."""
    venv = OUT_DIR.parents[1] / ".venv"
    return ".venv/bin/python" if Path(sys.prefix).resolve() == venv.resolve() else "python3"


@contextlib.contextmanager
def saved(name: str, save: bool) -> Iterator[Saved]:
    """Print as usual; with ``save``, also write <name>.md and <name>.csv (written even when
    the benchmark's target fails: the figures are what they are)."""
    out, buf = Saved(), io.StringIO()
    if not save:
        yield out
        return
    with contextlib.redirect_stdout(_Tee(sys.stdout, buf)):
        yield out
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    command = shlex.join([_interpreter(), f"benchmarks/{Path(sys.argv[0]).name}"]
                         + sys.argv[1:])
    head = (f"# {name}\n\nWritten by `{command}` on "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()} "
            f"({os.cpu_count()} CPUs, Linux {platform.release()}).\n\n```text\n")
    (OUT_DIR / f"{name}.md").write_text(head + buf.getvalue().rstrip() + "\n```\n",
                                        encoding="utf-8")
    if out._rows:
        with open(OUT_DIR / f"{name}.csv", "w", newline="", encoding="utf-8") as f:
            fields = list(dict.fromkeys(k for r in out._rows for k in r))
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(out._rows)
    print(f"saved {OUT_DIR / name}.md", file=sys.stderr)
