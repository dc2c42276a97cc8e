"""Optical RSA speed (issue 28): 10,000 lightpath requests simulated in under 60 s.

Two measurements, each against the same target:

- ``rsa only``: 10,000 Poisson requests (4–20 slots + 1 guard, 0.2 s mean hold) offered to
  NSFNET (80 slots per fiber, k = 4 shortest paths, first fit), at a light, a medium and a
  heavy load (20, 100 and 400 Erlangs; the heavy one blocks most);
- ``job + background``: one cell of experiments/optical-cba.yaml (ksp_ff+cba, GPipe, 16
  microbatches) with its burst background: the engine timing the iterations and every request
  (the job's and the background's) on the spectrum, until at least 10,000 were offered.

    .venv/bin/python benchmarks/bench_optical.py [--save]

No root. Wall time on this machine; another job on the same cores makes it slower.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchsave import add_save, saved

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testbed.optical.blocking import run_blocking  # noqa: E402
from testbed.optical.load import load_optical  # noqa: E402
from testbed.optical.nsfnet import nsfnet  # noqa: E402
from testbed.optical.spec import BackgroundSpec, BlockingRun, NetworkSpec  # noqa: E402
from testbed.optical.sweep import Cell, job_run  # noqa: E402

TARGET_REQUESTS, TARGET_S = 10_000, 60.0


def rsa_only(erlangs: float) -> dict:
    run = BlockingRun(network=NetworkSpec(use="nsfnet"), count=TARGET_REQUESTS, seed=1,
                      poisson=BackgroundSpec(kind="poisson", load=erlangs, slots=(4, 20),
                                             hold_s=0.2))
    res = run_blocking(run, nsfnet(), ROOT)
    return {"case": f"rsa only, {erlangs:g} Erlang", "requests": res.offered,
            "blocking": round(res.probability, 4), "wall_s": round(res.wall_s, 3)}


def job_and_background() -> dict:
    lo = load_optical(ROOT / "experiments" / "optical-cba.yaml")
    r = job_run(lo, Cell("ksp_ff+cba", 60, "gpipe", 16))
    t0, iterations = time.perf_counter(), 0
    while sum(r.rsa.requests.values()) < TARGET_REQUESTS:
        r.iterate()
        iterations += 1
    wall = time.perf_counter() - t0
    return {"case": f"job + background ({iterations} iterations)",
            "requests": sum(r.rsa.requests.values()),
            "blocking": round(r.rsa.blocking(), 4), "wall_s": round(wall, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_save(ap)
    args = ap.parse_args()
    with saved("bench_optical", args.save) as out:
        rows = [rsa_only(e) for e in (20, 100, 400)] + [job_and_background()]
        ok = True
        print(f"{'case':<38} {'requests':>9} {'blocking':>9} {'wall s':>8} "
              f"{'requests/s':>11}  target")
        for row in rows:
            row["requests_per_s"] = round(row["requests"] / row["wall_s"])
            row["pass"] = row["requests"] >= TARGET_REQUESTS and row["wall_s"] < TARGET_S
            ok &= row["pass"]
            print(f"{row['case']:<38} {row['requests']:>9} {row['blocking']:>9} "
                  f"{row['wall_s']:>8} {row['requests_per_s']:>11}  "
                  f"{'PASS' if row['pass'] else 'FAIL'} (≥ {TARGET_REQUESTS} in < {TARGET_S:g} s)")
        print("PASS" if ok else "FAIL")
        out.rows(rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
