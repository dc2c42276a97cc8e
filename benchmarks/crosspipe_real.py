"""The CrossPipe reproduction's real run, with spread: per cell the measured iterations' spans
(count, median, min, max) from the workers' traces beside the simulator's prediction, and per
network configuration each schedule's change against 1F1B (medians; the range uses the
fastest and slowest iterations of both cells).

    sudo .venv/bin/python -m testbed run experiments/crosspipe.yaml
    .venv/bin/python benchmarks/crosspipe_real.py results/crosspipe/<run-id> \
        [--out results/crosspipe-example/spread.md]
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

from testbed.metrics import load_traces, per_iteration

KEYS = ("links.inter_dc.delay_ms", "links.inter_dc.rate_mbit")


def cell_spans(run_dir: Path) -> list[dict]:
    """The ok rows of ``run_dir/results.csv`` with their measured iterations' spans (s)."""
    with (run_dir / "results.csv").open(encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "ok"]
    for r in rows:
        cell_dir = run_dir / "cells" / r["cell_id"]
        if not cell_dir.is_dir():  # repeats > 0 live in <cell>-r<n>
            cell_dir = next(run_dir.glob(f"cells/{r['cell_id']}*"))
        r["spans"] = [it["span_s"] for it in per_iteration(load_traces(cell_dir))]
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| delay ms | rate Mbit/s | schedule | rule | n | median s | min s | max s | "
             "predicted s | vs 1F1B (median) | vs 1F1B (range) |", "|" + " --- |" * 11]
    base = {tuple(r[k] for k in KEYS): r for r in rows if r["workload.schedule"] == "1f1b"}
    for r in rows:
        s, b = r["spans"], base.get(tuple(r[k] for k in KEYS))
        med = statistics.median(s)
        if b is None:
            vs = rng = "–"
        else:
            bm = statistics.median(b["spans"])
            vs = f"{100 * (med - bm) / bm:+.1f} %"
            lo = 100 * (min(s) - max(b["spans"])) / max(b["spans"])
            hi = 100 * (max(s) - min(b["spans"])) / min(b["spans"])
            rng = f"{lo:+.1f} … {hi:+.1f} %"
        lines.append(f"| {r[KEYS[0]]} | {r[KEYS[1]]} | {r['workload.schedule']} | "
                     f"{r.get('schedule_rule', '')} | {len(s)} | {med:.4f} | {min(s):.4f} | "
                     f"{max(s):.4f} | {float(r['predicted_iteration_time_s']):.4f} | {vs} | "
                     f"{rng} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", type=Path, help="write the table (markdown) here too")
    args = ap.parse_args()
    text = table(cell_spans(args.run_dir))
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
