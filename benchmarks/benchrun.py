"""What the benchmarks that run an experiment file share: running it through the runner, and
printing their checks as a Markdown table with the count of failures."""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import pandas as pd

from benchsave import add_save, saved

ROOT = Path(__file__).resolve().parents[1]


def run_experiment(exp: Path, out: Path, env: dict | None = None) -> tuple[pd.DataFrame, Path]:
    """``python -m testbed run exp --results out --quiet``: (its results.csv, the run
    directory); exits with the runner's output when it did not get as far as rows (an exit
    other than 0, all ok, or 1, some cell failed). Empty text cells read as NaN."""
    res = subprocess.run([sys.executable, "-m", "testbed", "run", str(exp), "--results",
                          str(out), "--quiet"], cwd=ROOT, capture_output=True, text=True,
                         env=env)
    if res.returncode not in (0, 1):
        raise SystemExit(f"{exp}: exit {res.returncode}\n{res.stdout[-3000:]}{res.stderr[-3000:]}")
    (csv,) = out.glob("*/*/results.csv")
    return pd.read_csv(csv, keep_default_na=False, na_values=[""]), csv.parent


def run_checked(name: str, experiment: Path, doc: str,
                check: Callable[[pd.DataFrame], list[dict]], cols: list[str],
                between: Callable[[pd.DataFrame, Path], None] | None = None) -> int:
    """A benchmark that runs one experiment file: parse ``--results``/``--save``, run it, print
    what ``between`` prints (given the rows and the run directory), then ``check``'s verdicts
    as ``cols``, saved as ``name``; returns the exit status (1 when a check FAILs)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    add_results_dir(ap)
    add_save(ap)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, saved(name, args.save) as out:
        df, run_dir = run_experiment(experiment, (args.results or Path(tmp)) / experiment.stem)
        rows = check(df)
        if between is not None:
            between(df, run_dir)
        fails = print_verdicts(rows, cols)
        out.rows(rows)
    return 1 if fails else 0


def add_results_dir(ap) -> None:
    """``--results DIR``: keep the run directory there (default: a temporary one, removed)."""
    ap.add_argument("--results", type=Path, metavar="DIR",
                    help="keep the run directory under DIR (default: a temporary one)")


def print_table(rows: list[dict], cols: list[str]) -> None:
    """``rows`` as a Markdown table of ``cols`` (a missing value as an empty cell)."""
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")


def print_verdicts(rows: list[dict], cols: list[str]) -> int:
    """Print the checks and how many passed; returns the number of FAILs."""
    print_table(rows, cols)
    fails = sum(str(r.get("verdict", "")).startswith("FAIL") for r in rows)
    print(f"\n{len(rows) - fails} of {len(rows)} checks PASS (or a ratio)")
    return fails
