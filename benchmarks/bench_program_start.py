"""How a user's program starts: every rank forked from one pre-started interpreter
(``workload.program.start: fork``, the default) against a new interpreter per rank as torchrun
starts them (``start: process``), the same plain scripts as bench_program.py
(examples/plain_pipeline.py, tests/runner/programs/user_ddp.py) across two emulated DCs.

Targets:
- what the program measures is the same either way: per style, the row's iteration time and
  the program's own steady-state step time with ``fork`` within 3 % of ``process`` (the
  tolerance bench_program holds the row to);
- forking saves what it is for: the sweep's CPU (the ``testbed run`` process and everything
  it started, its control runs included) and each cell's wall time are lower with ``fork``
  (ratios fork / process printed; the baseline is the ``process`` sweep of the same run).

Run: ``sudo .venv/bin/python benchmarks/bench_program_start.py [--save]`` (root: namespaces;
about 10 minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from bench_program import EXP, ROOT, STEPS, STYLES, WARMUP, _zip, own, run_sweep, verdict
from benchsave import add_save, saved

START_REL = 0.03  # fork vs process, iteration time (bench_program's ITERATION_REL)
MODES = ("fork", "process")


def styles_with(start: str) -> dict:
    """bench_program's styles, each program told how to start."""
    return {name: (pp, dp, delay, prog.replace("{argv:", f"{{start: {start}, argv:", 1))
            for name, (pp, dp, delay, prog) in STYLES.items()}


def sweep(tmp: Path, start: str) -> tuple[pd.DataFrame, Path, float, float]:
    """(rows, run directory, CPU seconds of the run and all it started, wall seconds)."""
    body = EXP.format(name=f"start-{start}", root=ROOT, steps=STEPS, warmup=WARMUP,
                      zip=_zip(styles_with(start)))
    (tmp / start).mkdir()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    df, run = run_sweep(tmp / start, f"start-{start}", body)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return df, run, cpu, wall


def own_step(run: Path, row: pd.Series) -> float:
    return own([run / "cells" / row.cell_id / f"worker-rank{k}.log" for k in range(4)])[0]


def compare(runs: dict) -> list[dict]:
    """Per style: fork vs process, the row's iteration time, the program's own step time and
    the cell's duration."""
    (fdf, frun, *_), (pdf, prun, *_) = runs["fork"], runs["process"]
    rows = []
    print(f"{'style':14s} {'row fork':>9s} {'process':>9s} {'Δ %':>6s} {'own fork':>9s} "
          f"{'process':>9s} {'Δ %':>6s} {'cell s fork':>11s} {'process':>8s} {'ratio':>6s}")
    for name, (_, f), (_, p) in zip(STYLES, fdf.iterrows(), pdf.iterrows()):
        of, op = own_step(frun, f), own_step(prun, p)
        dr = (f.iteration_time_s / p.iteration_time_s - 1) * 100
        do = (of / op - 1) * 100
        ok = f.status == p.status == "ok" and max(abs(dr), abs(do)) <= START_REL * 100
        ratio = f.duration_s / p.duration_s
        print(f"{name:14s} {f.iteration_time_s:9.4f} {p.iteration_time_s:9.4f} {dr:+6.2f} "
              f"{of:9.4f} {op:9.4f} {do:+6.2f} {f.duration_s:11.2f} {p.duration_s:8.2f} "
              f"{ratio:6.3f}  {verdict(ok)}")
        rows.append(dict(style=name, row_fork_s=f.iteration_time_s,
                         row_process_s=p.iteration_time_s, row_delta_pct=round(dr, 2),
                         own_fork_s=round(of, 6), own_process_s=round(op, 6),
                         own_delta_pct=round(do, 2), cell_fork_s=f.duration_s,
                         cell_process_s=p.duration_s, verdict=verdict(ok)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_save(ap)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, saved("bench_program_start", args.save) as out:
        runs = {m: sweep(Path(tmp), m) for m in MODES}
        rows = compare(runs)
        (_, _, fcpu, fwall), (_, _, pcpu, pwall) = runs["fork"], runs["process"]
        cpu_ok, wall_ok = fcpu < pcpu, fwall < pwall
        print(f"\nthe whole sweep (6 cells of 4 ranks and their control runs): CPU fork "
              f"{fcpu:.1f} s, "
              f"process {pcpu:.1f} s (ratio {fcpu / pcpu:.3f}, target < 1: "
              f"{verdict(cpu_ok)}); wall fork {fwall:.1f} s, process {pwall:.1f} s (ratio "
              f"{fwall / pwall:.3f}, target < 1: {verdict(wall_ok)})")
        good = cpu_ok and wall_ok and all(r["verdict"] == "PASS" for r in rows)
        print(f"\noverall: {verdict(good)}")
        out.rows(rows + [dict(style="whole sweep", cpu_fork_s=round(fcpu, 1),
                              cpu_process_s=round(pcpu, 1), wall_fork_s=round(fwall, 1),
                              wall_process_s=round(pwall, 1))])
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
