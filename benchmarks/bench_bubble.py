"""Measured pipeline bubble vs theory: 4 ranks over loopback, emulated compute F = 20 ms,
B = 40 ms, no added latency, GPipe and 1F1B at m = 4, 8, 16.

Theory for both: bubble (idle / span) = (p − 1) / (m + p − 1) and iteration time
(m + p − 1)(F + B). Target (worker issue): measured bubble within 2 percentage points.
The same check runs in tests/train/test_workers.py; this prints the numbers.

Run: ``.venv/bin/python benchmarks/bench_bubble.py [--save]`` (no root; about 1 minute).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from testbed.readout.traces import metrics_from_traces
from testbed.spec import Compute, ModelSpec, Parallel, Workload
from testbed.launch.loopback import run_local

from benchsave import add_save, saved

P, F_MS, B_MS = 4, 20, 40
TARGET_PP = 2.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_save(ap)
    args = ap.parse_args()
    with saved("bench_bubble", args.save) as out:
        ok, rows = table()
        out.rows(rows)
    return 0 if ok else 1


def table() -> tuple[bool, list[dict]]:
    """Run every schedule × m and print the table; (every target met, rows)."""
    ok, rows = True, []
    print(f"{'schedule':8} {'m':>3} {'theory':>7} {'bubble':>7} {'diff pp':>8} "
          f"{'ideal s':>8} {'iter s':>7} {'iter/ideal':>10}  target ±{TARGET_PP:g} pp")
    for schedule in ("gpipe", "1f1b"):
        for m in (4, 8, 16):
            w = Workload(model=ModelSpec(layers=4, hidden=32, heads=2, seq_len=16, vocab=64),
                         parallel=Parallel(pp=P), schedule=schedule, microbatches=m,
                         compute=Compute(forward_ms=F_MS, backward_ms=B_MS), iterations=5,
                         warmup=1)
            with tempfile.TemporaryDirectory(prefix="bench-bubble-") as d:
                run_local(w, Path(d), timeout_s=300)
                got = metrics_from_traces(Path(d), w)
            theory = (P - 1) / (m + P - 1)
            ideal = (m + P - 1) * (F_MS + B_MS) / 1e3
            diff = (got["bubble_ratio"] - theory) * 100
            good = abs(diff) <= TARGET_PP
            ok &= good
            rows.append({"schedule": schedule, "m": m, "theory": round(theory, 4),
                         "bubble": got["bubble_ratio"], "ideal_s": ideal,
                         "iteration_time_s": got["iteration_time_s"]})
            print(f"{schedule:8} {m:3d} {theory:7.3f} {got['bubble_ratio']:7.3f} {diff:+8.2f} "
                  f"{ideal:8.3f} {got['iteration_time_s']:7.3f} "
                  f"{got['iteration_time_s'] / ideal:10.3f}  {'PASS' if good else 'FAIL'}")
    return ok, rows


if __name__ == "__main__":
    sys.exit(main())
