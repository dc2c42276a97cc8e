"""Tracing overhead: the same workload traced (every action recorded) and untraced (iteration
records only, ``--no-trace-actions``), in the same invocation.

Each configuration runs REPEATS times, traced and untraced alternating so that both see the
same machine state; the table shows the median iteration time of each (median over runs of the
per-run median) and the overhead = traced / untraced − 1. Target (worker issue): ≤ 1 %.
Run-to-run noise on a 2-core machine is several percent, larger than the overhead itself, so
the table also shows a direct bound: the measured cost of one ``Tracer.action`` call (timed
alone, JSON encoding and the per-iteration flush included) × the records one rank writes per
iteration ÷ the iteration time.

Workloads: emulated compute with short actions (many records per second: the worst case for
tracing relative to compute) and real compute of a small GPT, both over loopback with gloo.

Run: ``.venv/bin/python benchmarks/bench_tracing.py`` (no root needed; about 3 minutes).
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from testbed.metrics import metrics_from_traces
from testbed.spec import Compute, ModelSpec, Parallel, Workload
from testbed.train.local import run_local
from testbed.train.trace import Tracer

REPEATS = 5
TARGET = 0.01

CONFIGS = {
    "emulated 4 ranks 1f1b m=16 F=5 B=10 ms": Workload(
        model=ModelSpec(layers=4, hidden=256, heads=4, seq_len=128, vocab=1000),
        parallel=Parallel(pp=4), schedule="1f1b", microbatches=16,
        compute=Compute(forward_ms=5, backward_ms=10), iterations=8, warmup=2),
    "real 2 ranks 1f1b m=8 (small GPT)": Workload(
        model=ModelSpec(layers=4, hidden=128, heads=4, seq_len=64, vocab=1000),
        parallel=Parallel(pp=2), schedule="1f1b", microbatches=8,
        compute=Compute(mode="real"), iterations=8, warmup=2),
}


def one(w: Workload, traced: bool) -> tuple[float, int]:
    """Median iteration time (s) of one run and the number of trace records it wrote."""
    with tempfile.TemporaryDirectory(prefix="bench-tracing-") as d:
        out = Path(d)
        run_local(w, out, timeout_s=600, extra=[] if traced else ["--no-trace-actions"])
        records = sum(len(p.read_text().splitlines()) for p in out.glob("trace-rank*.jsonl"))
        return metrics_from_traces(out, w)["iteration_time_s"], records


def record_cost_s(n: int = 200_000) -> float:
    """Seconds per traced action record, flushed every 100 records as a worker would."""
    with tempfile.TemporaryDirectory(prefix="bench-tracing-") as d:
        tr = Tracer(Path(d) / "trace-rank0.jsonl")
        t0 = time.perf_counter()
        for i in range(n):
            tr.action(1, "F", 3, i % 64, 123456789012, 123456799012, "compute", 0, None)
            if i % 100 == 99:
                tr.flush()
        tr.end("ok", None)
        return (time.perf_counter() - t0) / n


def main() -> int:
    cost = record_cost_s()
    rows, ok = [], True
    for name, w in CONFIGS.items():
        times: dict[bool, list[float]] = {True: [], False: []}
        recs = {}
        for i in range(REPEATS):
            for traced in ((True, False) if i % 2 == 0 else (False, True)):
                t, n = one(w, traced)
                times[traced].append(t)
                recs[traced] = n
            print(f"  {name}: run {i + 1}/{REPEATS} traced {times[True][-1] * 1e3:.1f} ms, "
                  f"untraced {times[False][-1] * 1e3:.1f} ms", file=sys.stderr)
        on, off = statistics.median(times[True]), statistics.median(times[False])
        overhead = on / off - 1
        per_rank_iter = (recs[True] - recs[False]) / (w.iterations * w.world_size)
        bound = cost * per_rank_iter / off
        ok &= overhead <= TARGET and bound <= TARGET
        rows.append((name, off, on, overhead, per_rank_iter, bound))
    print(f"\none trace record costs {cost * 1e6:.2f} µs (timed alone)")
    print(f"{'workload':42} {'untraced ms':>12} {'traced ms':>10} {'overhead':>9} "
          f"{'rec/rank/it':>12} {'bound':>7}  target ≤ {TARGET:.0%}")
    for name, off, on, ov, n, bound in rows:
        verdict = "PASS" if ov <= TARGET and bound <= TARGET else "FAIL"
        print(f"{name:42} {off * 1e3:12.1f} {on * 1e3:10.1f} {ov:+9.2%} {n:12.0f} "
              f"{bound:7.3%}  {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
