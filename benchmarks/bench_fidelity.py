"""Self-fidelity: what a busy box does to emulated compute, and whether the verdict says so.

Real workers over loopback (4 ranks, 1F1B, m = 8, emulated F = 5 ms, B = 10 ms) run while
0, 1, 2, 4 and 8 processes that only burn CPU (started and stopped here, by pid) share this
machine. Per run: the box's CPU busy share over the measured iterations (/proc/stat, the
runner's sampler), the emulated compute overshoot (actual − modelled per action: p50, p99, and
the stretch beyond the calibrated sleep overshoot in % of the modelled time), late iteration
starts, the median iteration time against the simulator's prediction, and the fidelity
verdict (``testbed.readout.fidelity.verdict``; no network here, so no drops).

Target (issue 15): every run measured outside ±5 % of its prediction is marked degraded
(PASS/FAIL per run). The table also shows at which CPU busy share the overshoot starts to
distort, which is what ``CPU_BUSY_MAX_PCT`` rests on.

Run: ``.venv/bin/python benchmarks/bench_fidelity.py [--save]`` (no root; 4 to 10 minutes,
longer on a busy machine).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from testbed.launch.loopback import run_local
from testbed.readout.traces import load_traces, per_iteration
from testbed.readout import cpu as C, fidelity as F
from testbed.spec import Compute, ModelSpec, Parallel, Workload

from bench_sim import loopback_experiment, predict
from benchsave import add_save, saved

LOADS = (0, 1, 2, 4, 8)  # CPU-burning processes beside the workers
REPEATS = 2
WORKLOAD = Workload(model=ModelSpec(layers=4, hidden=32, heads=2, seq_len=16, vocab=64),
                    parallel=Parallel(pp=4), schedule="1f1b", microbatches=8,
                    compute=Compute(forward_ms=5, backward_ms=10), iterations=12, warmup=2)


def burn(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def one(load: int, predicted_s: float) -> dict:
    """One run beside ``load`` CPU burners: its fidelity signals, verdict and PASS/FAIL."""
    burners = burn(load)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-fidelity-") as d, C.CpuSampler() as cpu:
            run_local(WORKLOAD, Path(d), timeout_s=600)
            traces = load_traces(Path(d))
    finally:
        for p in burners:
            p.kill()
            p.wait()
    measured = statistics.median(i["span_s"] for i in per_iteration(traces))
    s = F.Signals(overshoot=F.compute_overshoot(traces), late=F.late_starts(traces),
                  cpu_busy_pct=cpu.busy_pct_between(*F.measured_window(traces)),
                  measured_s=measured, predicted_s=predicted_s)
    text, d = F.verdict(s)
    outside = abs(d["predicted_gap_pct"]) > F.AGREEMENT_PCT
    return {"burners": load, "cpu_busy_pct": d["cpu_busy_pct"],
            "overshoot_p50_ms": d["compute_overshoot_p50_ms"],
            "overshoot_p99_ms": d["compute_overshoot_p99_ms"],
            "stretch_pct": d["compute_stretch_pct"], "late_starts": d["late_starts"],
            "iteration_ms": round(measured * 1e3, 2), "predicted_ms": round(predicted_s * 1e3, 2),
            "gap_pct": d["predicted_gap_pct"], "fidelity": text,
            "result": "FAIL" if outside and text == "ok" else "PASS"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_save(ap)
    args = ap.parse_args()
    predicted = predict(loopback_experiment(WORKLOAD))["predicted_iteration_time_s"]
    with saved("bench_fidelity", args.save) as out:
        print(f"{os.cpu_count()} CPUs; 4 ranks 1f1b m=8 F=5 B=10 ms emulated over loopback; "
              f"predicted iteration {predicted * 1e3:.2f} ms; thresholds: CPU busy > "
              f"{F.CPU_BUSY_MAX_PCT:.0f} %, stretch > {F.COMPUTE_STRETCH_MAX_PCT} %, gap > "
              f"±{F.AGREEMENT_PCT:.0f} %")
        rows = [one(load, predicted) for _ in range(REPEATS) for load in LOADS]
        cols = list(rows[0])
        print(" | ".join(cols))
        for r in sorted(rows, key=lambda r: r["burners"]):
            print(" | ".join(str(r[c]) for c in cols))
        ok = all(r["result"] == "PASS" for r in rows)
        print(f"{'PASS' if ok else 'FAIL'}: every run outside ±{F.AGREEMENT_PCT:.0f} % of its "
              "prediction is marked degraded")
        out.rows(rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
