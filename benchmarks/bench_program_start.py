"""How a user's program starts: every rank forked from one pre-started interpreter
(``workload.program.start: fork``, the default) against a new interpreter per rank as torchrun
starts them (``start: process``), the same plain scripts as bench_program.py
(examples/plain_pipeline.py, tests/runner/programs/user_ddp.py) across two emulated DCs.

Targets:
- what the program measures is the same either way: per style, the row's iteration time and
  the program's own steady-state step time with ``fork`` within 3 % of ``process`` (the
  tolerance bench_program holds the row to). Two sweeps run minutes apart drifted by more
  than that on this box (gpipe at 20 ms −5.12 %: results/benchmarks/
  bench_program_start_two_sweeps.md, this benchmark's first version), so these come from one
  sweep in which each style runs
  fork, process, process, fork (cells in that order, the means of each pair compared: a
  steady drift cancels);
- forking saves what it is for: the sweep's CPU (the ``testbed run`` process and everything
  it started, its control runs included) and each cell's wall time are lower with ``fork``
  (ratios fork / process printed; the baseline is the ``process`` sweep of the same run).

Run: ``sudo .venv/bin/python benchmarks/bench_program_start.py [--save]`` (root: namespaces;
about 12 minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from bench_program import EXP, ROOT, STEPS, STYLES, WARMUP, _zip, own, run_sweep, verdict
from benchsave import add_save, saved

START_REL = 0.03  # fork vs process, iteration time (bench_program's ITERATION_REL)
MODES = ("fork", "process")


def styles_with(start: str, styles: dict = STYLES) -> dict:
    """bench_program's styles, each program told how to start."""
    return {name: (pp, dp, delay, prog.replace("{argv:", f"{{start: {start}, argv:", 1))
            for name, (pp, dp, delay, prog) in styles.items()}


def interleaved() -> dict:
    """Each style four times in a row, fork, process, process, fork (keyed name/start/i),
    without control runs; a variable no interpreter reads at start-up (BENCH_CELL) keeps the
    four cells apart (cells of equal settings would be one cell)."""
    out = {}
    for name, (pp, dp, delay, prog) in STYLES.items():
        for i, start in enumerate(("fork", "process", "process", "fork")):
            tagged = prog.replace("{argv:", f"{{start: {start}, env: {{BENCH_CELL: '{i}'}}, "
                                            "argv:", 1).replace(", control: true", "")
            out[f"{name}/{start}/{i}"] = (pp, dp, delay, tagged)
    return out


def sweep(tmp: Path, name: str, styles: dict) -> tuple[pd.DataFrame, Path, float, float]:
    """(rows, run directory, CPU seconds of the run and all it started, wall seconds)."""
    body = EXP.format(name=name, root=ROOT, steps=STEPS, warmup=WARMUP, zip=_zip(styles))
    (tmp / name).mkdir()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    df, run = run_sweep(tmp / name, name, body)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return df, run, cpu, wall


def own_step(run: Path, row: pd.Series) -> float:
    return own([run / "cells" / row.cell_id / f"worker-rank{k}.log" for k in range(4)])[0]


def compare(df: pd.DataFrame, run: Path) -> list[dict]:
    """Per style, from the interleaved sweep: fork vs process, the row's iteration time, the
    program's own step time and the cell's duration (means of each start's two cells)."""
    rows = []
    print(f"{'style':14s} {'row fork':>9s} {'process':>9s} {'Δ %':>6s} {'own fork':>9s} "
          f"{'process':>9s} {'Δ %':>6s} {'cell s fork':>11s} {'process':>8s} {'ratio':>6s}")
    cells = list(zip(interleaved(), (r for _, r in df.iterrows())))
    for name in STYLES:
        got = {m: [r for key, r in cells if key.startswith(f"{name}/{m}/")] for m in MODES}
        ok = all(r.status == "ok" for rs in got.values() for r in rs)
        mean = {m: {k: statistics.fmean(v) for k, v in (
            ("row", [r.iteration_time_s for r in rs]), ("own", [own_step(run, r) for r in rs]),
            ("cell", [r.duration_s for r in rs]))} for m, rs in got.items()}
        f, p = mean["fork"], mean["process"]
        dr, do = (f["row"] / p["row"] - 1) * 100, (f["own"] / p["own"] - 1) * 100
        ok = ok and max(abs(dr), abs(do)) <= START_REL * 100
        print(f"{name:14s} {f['row']:9.4f} {p['row']:9.4f} {dr:+6.2f} {f['own']:9.4f} "
              f"{p['own']:9.4f} {do:+6.2f} {f['cell']:11.2f} {p['cell']:8.2f} "
              f"{f['cell'] / p['cell']:6.3f}  {verdict(ok)}")
        rows.append(dict(style=name, row_fork_s=round(f["row"], 6),
                         row_process_s=round(p["row"], 6), row_delta_pct=round(dr, 2),
                         own_fork_s=round(f["own"], 6), own_process_s=round(p["own"], 6),
                         own_delta_pct=round(do, 2), cell_fork_s=round(f["cell"], 2),
                         cell_process_s=round(p["cell"], 2), verdict=verdict(ok)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_save(ap)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, saved("bench_program_start", args.save) as out:
        df, run, *_ = sweep(Path(tmp), "start-interleaved", interleaved())
        rows = compare(df, run)
        whole = {m: sweep(Path(tmp), f"start-{m}", styles_with(m))[2:] for m in MODES}
        (fcpu, fwall), (pcpu, pwall) = whole["fork"], whole["process"]
        cpu_ok, wall_ok = fcpu < pcpu, fwall < pwall
        print(f"\nbench_program's sweep (6 cells of 4 ranks and their control runs), each way: "
              f"CPU fork {fcpu:.1f} s, process {pcpu:.1f} s (ratio {fcpu / pcpu:.3f}, target "
              f"< 1: {verdict(cpu_ok)}); wall fork {fwall:.1f} s, process {pwall:.1f} s (ratio "
              f"{fwall / pwall:.3f}, target < 1: {verdict(wall_ok)})")
        good = cpu_ok and wall_ok and all(r["verdict"] == "PASS" for r in rows)
        print(f"\noverall: {verdict(good)}")
        out.rows(rows + [dict(style="whole sweep", cpu_fork_s=round(fcpu, 1),
                              cpu_process_s=round(pcpu, 1), wall_fork_s=round(fwall, 1),
                              wall_process_s=round(pwall, 1))])
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
