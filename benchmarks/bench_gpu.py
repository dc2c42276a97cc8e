"""GPUs and NCCL across emulated DCs against the issue's targets, on a machine with a GPU.

Runs experiments/gpu-nccl.yaml through the runner (netns backend: two emulated hosts, one per
DC, joined by a 20 ms, 10 Gbit/s link; pp = 2, emulated compute, activations of 4 MiB on the
GPU) and checks:

- the NCCL read-back: one activation's one-way time across the boundary, timed by the
  boundary ranks over NCCL before the first iteration, within 5 % of the configured delay +
  serialisation;
- the pipeline cell over NCCL: measured iteration time within 5 % of the simulator's;
- NCCL connected the two emulated hosts over its socket transport only (``NET/Socket``) and
  nothing bypassed the emulated link (``nccl_bypass`` empty), though both ranks share one GPU;
- the same cell over gloo (CPU tensors) from the same run, as the baseline: its iteration time
  against its prediction, and NCCL's iteration time over gloo's.

Run (root, CUDA build of torch): ``sudo python benchmarks/bench_gpu.py [--save]
[--results DIR]``. Without a GPU it says so and exits 2.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

from benchrun import add_results_dir, print_verdicts, run_experiment
from benchsave import add_save, saved

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = ROOT / "experiments" / "gpu-nccl.yaml"
READBACK_PCT, ITER_PCT = 5.0, 5.0


def environment() -> str:
    import torch
    if not torch.cuda.is_available():
        return ""
    nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
    return (f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}, "
            f"{torch.cuda.get_device_name(0)} × {torch.cuda.device_count()}")


def _pct(measured: float, expected: float) -> float:
    return round(100 * (measured / expected - 1), 2)


def check(df: pd.DataFrame) -> list[dict]:
    rows = []
    by = {r.get("dist_backend"): r for _, r in df.iterrows()
          if r["status"] == "ok" and pd.notna(r.get("dist_backend"))}
    for _, r in df.iterrows():
        if r["status"] != "ok":
            rows.append({"what": f"cell {r['cell_id']}", "verdict": f"FAIL: {r['error']}"})
    nccl, gloo = by.get("nccl"), by.get("gloo")
    if nccl is not None:
        got, want = nccl["activation_readback_s"], nccl["activation_readback_expected_s"]
        if pd.notna(got):
            g = _pct(got, want)
            rows.append({"what": "NCCL read-back, one activation (s)", "configured": want,
                         "measured": got, "gap_pct": g,
                         "verdict": "PASS" if abs(g) <= READBACK_PCT else "FAIL"})
        else:
            rows.append({"what": "NCCL read-back", "verdict": "FAIL: not recorded"})
        rows.append(_iteration("pipeline over NCCL", nccl))
        ok = nccl["nccl_transports"] == "NET/Socket" and pd.isna(nccl["nccl_bypass"])
        rows.append({"what": "NCCL transports between emulated hosts",
                     "configured": "NET/Socket", "measured": nccl["nccl_transports"],
                     "verdict": "PASS" if ok else f"FAIL (bypass: {nccl['nccl_bypass']})"})
    if gloo is not None:
        rows.append(_iteration("baseline: pipeline over gloo", gloo))
    if nccl is not None and gloo is not None:
        rows.append({"what": "iteration time, NCCL / gloo", "measured":
                     round(nccl["iteration_time_s"] / gloo["iteration_time_s"], 3),
                     "verdict": "ratio"})
    return rows


def _iteration(what: str, r) -> dict:
    g = _pct(r["iteration_time_s"], r["predicted_iteration_time_s"])
    return {"what": f"{what}: iteration (s)", "configured": r["predicted_iteration_time_s"],
            "measured": r["iteration_time_s"], "gap_pct": g,
            "verdict": "PASS" if abs(g) <= ITER_PCT else f"FAIL ({r['fidelity']})"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_results_dir(ap)
    add_save(ap)
    args = ap.parse_args()
    env = environment()
    if not env:
        print("bench_gpu: this machine has no CUDA device (torch.cuda.is_available() is "
              "False); run it where there is one", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp, saved("bench_gpu", args.save) as out:
        print(f"{env}\n")
        df, _ = run_experiment(EXPERIMENT, (args.results or Path(tmp)) / EXPERIMENT.stem)
        rows = check(df)
        fails = print_verdicts(rows, ["what", "configured", "measured", "gap_pct", "verdict"])
        out.rows(rows)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
