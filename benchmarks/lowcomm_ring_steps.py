"""Why overlapped Streaming DiLoCo measures slower than predicted: the ring steps of its sync
steps, measured beside the simulator's.

Runs the overlapped streaming cell of ``benchmarks/lowcomm.yaml`` (three DCs, a 2-stage
pipeline in each, 2 fragments, ``overlap_steps: 1``) through ``testbed run`` (root), then
reads every ``ALLREDUCE_STEP`` of the measured sync steps from the ranks' traces (posted to
done: the rank's chunk out and its neighbour's in) and sets their durations beside the
simulator's cadence for the same iteration (a rank's step start to its next). Both stages'
rings cross the same link directions and, overlapped, start together with the iteration; the
simulator serves their chunks in turn (a chunk that fits in the queue enters it whole), so
after the first step the rings run out of step and each step takes one chunk's serialisation
plus the delay. A step that took longer than the model's cadence plus half a chunk's
serialisation is counted as one in which the two rings' chunks shared the link.

    sudo .venv/bin/python benchmarks/lowcomm_ring_steps.py [--save]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

from benchrun import run_experiment
from benchsave import add_save, saved

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "benchmarks" / "lowcomm.yaml"


def overlapped_cell(tmp: Path) -> Path:
    """lowcomm.yaml with its matrix cut to the overlapped streaming cell."""
    doc = yaml.safe_load(SOURCE.read_text())
    doc["name"] = "lowcomm-ring-steps"
    doc["workload"]["gradient_sync"] = {"mode": "streaming", "inner_steps": 4, "fragments": 2,
                                       "overlap_steps": 1}
    del doc["matrix"]
    path = tmp / "ring-steps.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def measured_steps(cell_dir: Path, warmup: int) -> list[float]:
    """Every measured ALLREDUCE_STEP's duration (s), over the ranks."""
    from testbed.readout.traces import load_traces
    return [(r["t1"] - r["t0"]) / 1e9 for recs in load_traces(cell_dir).values() for r in recs
            if r.get("type") == "action" and r["kind"] == "ALLREDUCE_STEP"
            and r["iter"] >= warmup]


def simulated(exp: Path) -> tuple[int, float, float]:
    """(the simulated sync step's ring steps, their cadence (s: a rank's step start to its
    next), one chunk's serialisation (s))."""
    from testbed.plan import plan_cell
    from testbed.plan.outer import grad_numel, measured_kinds, sync_input
    from testbed.sim import run
    from testbed.spec import load_experiment
    plan = plan_cell(load_experiment(exp).cells[0])
    w = plan.experiment.workload
    kind = next(k for k in measured_kinds(w).values() if k)
    res = run(sync_input(plan.sim_input(), plan.slots, plan.schedule, w,
                         grad_numel(w, plan.schedule.n_stages), kind))
    steps = [s for s in res.spans if s.kind == "ALLREDUCE_STEP"]
    first = sorted(s.t0 for s in steps if s.rank == steps[0].rank)
    cadence = statistics.median(b - a for a, b in zip(first, first[1:]))
    path = plan.paths.path(plan.slots[0], next(s for s in plan.slots if s.dc != plan.slots[0].dc))
    # a step that queued behind nothing: the receiver's notice (one delay), then its chunk
    chunk = min(s.t1 - s.t0 for s in steps) - path.delay_s
    return len(steps), cadence, chunk


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_save(ap)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, saved("lowcomm_ring_steps", args.save) as out:
        exp = overlapped_cell(Path(tmp))
        df, run_dir = run_experiment(exp, Path(tmp) / "r")
        row = df.iloc[0]
        (cell_dir,) = (run_dir / "cells").iterdir()
        got = measured_steps(cell_dir, yaml.safe_load(exp.read_text())["workload"]["warmup"])
        simulated_steps, cadence, chunk = simulated(exp)
        slow = [d for d in got if d > cadence + chunk / 2]
        fast = [d for d in got if d <= cadence + chunk / 2]
        print(f"cell {row['cell_id']}: status {row['status']}; mean iteration "
              f"{row['mean_iteration_time_s']} s, predicted "
              f"{row['predicted_mean_iteration_time_s']} s; sync {row['outer_sync_s']} s, "
              f"predicted {row['predicted_outer_sync_s']} s")
        print(f"simulated: {simulated_steps} ring steps; a rank's steps start {cadence:.4f} s "
              f"apart (median), of which one chunk's serialisation is {chunk:.4f} s: the two rings "
              f"take turns on each link direction")
        print(f"measured ring steps: {len(got)}; {len(fast)} within the model's cadence + half "
              f"a chunk (median {statistics.median(fast) if fast else float('nan'):.4f} s), "
              f"{len(slow)} longer (median {statistics.median(slow) if slow else float('nan'):.4f}"
              f" s): the two rings' chunks on the link at once")
        out.rows([{"what": "measured ring steps", "count": len(got)},
                  {"what": "within cadence + half a chunk", "count": len(fast),
                   "median_s": round(statistics.median(fast), 6) if fast else None},
                  {"what": "longer", "count": len(slow),
                   "median_s": round(statistics.median(slow), 6) if slow else None},
                  {"what": "simulated cadence", "median_s": round(cadence, 6)}])
    return 0


if __name__ == "__main__":
    sys.exit(main())
