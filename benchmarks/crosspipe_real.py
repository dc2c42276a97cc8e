"""The CrossPipe reproduction's real run, with spread: per cell the measured iterations' spans
(count, median, min, max; every repeat pooled) beside the simulator's prediction, and per
network configuration each schedule's change against 1F1B (medians; the range uses the
fastest and slowest iterations of both cells).

The spans come from each cell × repeat's ``iterations.csv``, else from its workers' traces. A
run directory that kept neither (such as results/crosspipe-example/, whose traces were not
committed) gives only the median from results.csv, and says so.

    sudo .venv/bin/python -m testbed run experiments/crosspipe.yaml
    .venv/bin/python benchmarks/crosspipe_real.py results/crosspipe/<run-id> \
        [--out results/crosspipe-example/spread.md] [--save]

``--save`` writes what it prints to results/benchmarks/crosspipe_real.md and one row per cell
to crosspipe_real.csv.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

from testbed.readout.traces import load_traces, per_iteration
from testbed.cell.celldir import ITERATIONS_CSV
from testbed.runner.store import cell_path

from benchsave import add_save, saved

KEYS = ("links.inter_dc.delay_ms", "links.inter_dc.rate_mbit")
NO_SERIES = ("n = –: the run directory kept no per-iteration series for the cell, so the "
             "median is results.csv's and there is no min, max or range.")


def repeat_spans(cell_dir: Path) -> list[float]:
    """One cell × repeat's measured iteration times (s); empty when nothing per iteration was
    kept."""
    series = cell_dir / ITERATIONS_CSV
    if series.is_file():
        with series.open(encoding="utf-8") as f:
            return [float(r["iteration_time_s"]) for r in csv.DictReader(f)]
    if any(cell_dir.glob("trace-rank*.jsonl")):
        return [it["span_s"] for it in per_iteration(load_traces(cell_dir))]
    return []


def cell_spans(run_dir: Path) -> list[dict]:
    """One entry per cell of ``run_dir/results.csv`` (ok rows): its first row, the spans of
    every repeat pooled, and the rows' own medians."""
    with (run_dir / "results.csv").open(encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "ok"]
    cells: dict[str, dict] = {}
    for r in rows:
        cell = cells.setdefault(r["cell_id"], {**r, "spans": [], "row_medians": []})
        cell["spans"] += repeat_spans(cell_path(run_dir, r["cell_id"], int(r.get("repeat") or 0)))
        cell["row_medians"].append(float(r["iteration_time_s"]))
    return list(cells.values())


def median_s(cell: dict) -> float:
    return statistics.median(cell["spans"] or cell["row_medians"])


def versus(cell: dict, base: dict | None) -> tuple[str, str]:
    """(change of the median vs 1F1B, the range from the fastest and slowest iterations)."""
    if base is None:
        return "–", "–"
    bm = median_s(base)
    vs = f"{100 * (median_s(cell) - bm) / bm:+.1f} %"
    s, b = cell["spans"], base["spans"]
    if not (s and b):
        return vs, "–"
    lo = 100 * (min(s) - max(b)) / max(b)
    hi = 100 * (max(s) - min(b)) / min(b)
    return vs, f"{lo:+.1f} … {hi:+.1f} %"


def table(cells: list[dict]) -> str:
    lines = ["| delay ms | rate Mbit/s | schedule | rule | n | median s | min s | max s | "
             "predicted s | vs 1F1B (median) | vs 1F1B (range) |", "|" + " --- |" * 11]
    base = {tuple(c[k] for k in KEYS): c for c in cells if c["workload.schedule"] == "1f1b"}
    for c in cells:
        s = c["spans"]
        vs, rng = versus(c, base.get(tuple(c[k] for k in KEYS)))
        spread = f"{len(s)} | {median_s(c):.4f} | {min(s):.4f} | {max(s):.4f}" if s else \
            f"– | {median_s(c):.4f} | – | –"
        lines.append(f"| {c[KEYS[0]]} | {c[KEYS[1]]} | {c['workload.schedule']} | "
                     f"{c.get('schedule_rule', '')} | {spread} | "
                     f"{float(c['predicted_iteration_time_s']):.4f} | {vs} | {rng} |")
    if not all(c["spans"] for c in cells):
        lines += ["", NO_SERIES]
    return "\n".join(lines) + "\n"


def csv_rows(cells: list[dict]) -> list[dict]:
    return [{"delay_ms": c[KEYS[0]], "rate_mbit": c[KEYS[1]],
             "schedule": c["workload.schedule"], "rule": c.get("schedule_rule", ""),
             "n": len(c["spans"]), "median_s": round(median_s(c), 6),
             "min_s": min(c["spans"], default=""), "max_s": max(c["spans"], default=""),
             "predicted_s": c["predicted_iteration_time_s"]} for c in cells]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", type=Path, help="write the table (markdown) here too")
    add_save(ap)
    args = ap.parse_args()
    cells = cell_spans(args.run_dir)
    text = table(cells)
    with saved("crosspipe_real", args.save) as out:
        print(f"run directory: {args.run_dir}\n")
        print(text)
        out.rows(csv_rows(cells))
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
