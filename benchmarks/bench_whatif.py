"""What-if at scale: how long `simulate` takes and how much memory it holds as cells grow to
thousands of ranks, a sweep of what-if cells on every core, and the fast paths against the
full event model.

- Sizes: `python -m testbed simulate` of one cell, 4 DCs (20 ms, 100 Gbit/s between them,
  8 ranks per host), 1F1B, m = 64, a 32-layer 4096-hidden model, pp = 16 and dp = 32, 128,
  512 (512 to 8,192 ranks), stages across DCs (in_order: 512 pipelines share each WAN link
  direction). Wall time and the process's peak RSS. Target (issue "What-if at the papers'
  sizes"): 8,192 ranks in ≤ 10 s with ≤ 1 GB. 100,000 ranks (≤ 120 s) is run only with
  ``--full``.
- Sweep: ``--cells`` cells (default 1,000) of 256 ranks (pp = 16 × dp = 16; every cell
  another WAN delay, so every plan is distinct) with ``simulate -j <cores>``, timed whole
  (target ≤ 5 minutes for 1,000). With fewer cells the 1,000-cell time is projected from the
  measured rate, which counts the process's start once per ``--cells`` cells and so
  overstates it.
- Emulated vs simulated: ``benchmarks/whatif-overlap.yaml``, the same cell family at the
  sizes this box builds (4 to 64 ranks: pp = 4 × dp = 1 … 16 and pp = 16 × dp = 1 … 4; the
  file says what is scaled down so that one 2-core box carries it), through ``testbed run``
  (root: namespaces and shapers): each cell's measured iteration time against the simulator's
  prediction for the same plan, the error per cell as the simulator papers report it, and
  their mean and largest. Each cell is held to the ±5 % the project's fidelity check uses.
  Skipped with ``--no-emulate`` or without root (said in the output).
- Fast paths: cells where both run, simulated with the fast paths and with
  ``SimInput.exhaustive`` (every quantum and ring step an event), in this process: the largest
  relative difference of any ``predicted_*`` value (target ≤ 0.1 %) and the speed-up.

Run: ``.venv/bin/python benchmarks/bench_whatif.py [--save] [--cells N] [--full]
[--no-emulate]``.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchrun import print_table, print_verdicts, run_experiment
from benchsave import add_save, saved

ROOT = Path(__file__).resolve().parents[1]
OVERLAP = ROOT / "benchmarks" / "whatif-overlap.yaml"
FIDELITY_PCT = 5.0
CELL = """\
name: whatif-{ranks}
topology:
  name: four-dc
  dcs:
{dcs}
  inter_dc: {{delay_ms: {delay}, rate_mbit: 100000}}
workload:
  model: {{layers: 32, hidden: 4096, heads: 32, seq_len: 2048, vocab: 32000}}
  parallel: {{pp: {pp}, dp: {dp}}}
  ranks_per_host: 8
  schedule: 1f1b
  microbatches: 64
  compute: {{mode: emulated, forward_ms: 20, backward_ms: 40}}
placement: {placement}
{matrix}"""
TARGET_S, TARGET_GB, TARGET_100K_S, TARGET_SWEEP_S, TARGET_AGREE = 10.0, 1.0, 120.0, 300.0, 1e-3


def cell_file(tmp: Path, pp: int, dp: int, placement: str = "in_order", matrix: str = "",
              delay: float = 20) -> Path:
    hosts = -(-pp * dp // (4 * 8))
    dcs = "\n".join(f"    - {{name: dc{i}, hosts: {hosts}}}" for i in range(1, 5))
    path = tmp / f"whatif-{pp}x{dp}-{placement}.yaml"
    path.write_text(CELL.format(ranks=pp * dp, dcs=dcs, pp=pp, dp=dp, placement=placement,
                                matrix=matrix, delay=delay))
    return path


def timed_simulate(path: Path, *args: str) -> tuple[float, float, str]:
    """(wall s, peak RSS GB of the child, its stderr's tail) of ``simulate path``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "testbed", "simulate", str(path), *args],
                         cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if res.returncode != 0:
        raise SystemExit(f"{path}: exit {res.returncode}\n{res.stderr[-2000:]}")
    # ru_maxrss of the children is the largest of any child so far (KiB)
    return wall, max(rss, before) / (1 << 20), res.stdout.strip().splitlines()[-2]


def sizes(tmp: Path, full: bool) -> list[dict]:
    rows = []
    for dp in (32, 128, 512) + ((6250,) if full else ()):
        wall, gb, line = timed_simulate(cell_file(tmp, 16, dp))
        ranks = 16 * dp
        target = {8192: (TARGET_S, TARGET_GB), 100_000: (TARGET_100K_S, None)}.get(ranks)
        verdict = ""
        if target:
            ok = wall <= target[0] and (target[1] is None or gb <= target[1])
            verdict = "PASS" if ok else "FAIL"
        rows.append({"check": f"simulate {ranks} ranks (pp=16 × dp={dp}, in_order)",
                     "configured": f"≤ {target[0]:g} s" + (f", ≤ {target[1]:g} GB"
                                                          if target[1] else "")
                     if target else "", "measured": f"{wall:.2f} s, {gb:.2f} GB",
                     "verdict": verdict})
        print(f"{ranks} ranks: {wall:.2f} s, peak {gb:.2f} GB; {line}", flush=True)
    if not full:
        rows.append({"check": "simulate 100,000 ranks", "configured": f"≤ {TARGET_100K_S:g} s",
                     "measured": "not run (--full)", "verdict": "FAIL (not shown)"})
    return rows


def sweep(tmp: Path, cells: int) -> list[dict]:
    delays = ", ".join(f"{10 + i * 0.5:g}" for i in range(cells))
    path = cell_file(tmp, 16, 16, matrix=f"matrix:\n  links.inter_dc.delay_ms: [{delays}]\n")
    jobs = os.cpu_count() or 1
    wall, _, _ = timed_simulate(path, "-j", str(jobs), "--parquet", str(tmp / "sweep.parquet"))
    projected = wall / cells * 1000
    how = "measured" if cells == 1000 else f"projected from {cells} cells"
    print(f"sweep: {cells} cells of 256 ranks on {jobs} processes in {wall:.2f} s "
          f"({wall / cells:.3f} s per cell); 1,000 cells {how}: {projected:.0f} s", flush=True)
    return [{"check": f"1,000-cell sweep at 256 ranks ({how}, {jobs} processes)",
             "configured": f"≤ {TARGET_SWEEP_S:g} s", "measured": f"{projected:.0f} s",
             "verdict": "PASS" if projected <= TARGET_SWEEP_S else "FAIL"}]


def agreement(tmp: Path) -> list[dict]:
    from testbed.plan import plan_cell
    from testbed.sim import predicted
    from testbed.sim.engine import simulate
    from testbed.spec import load_experiment

    rows = []
    for pp, dp, placement in ((16, 4, "in_order"), (16, 16, "in_order"), (4, 8, "dp_across_dcs"),
                              (16, 32, "in_order")):
        plan = plan_cell(load_experiment(cell_file(tmp, pp, dp, placement)).cells[0])
        inp = plan.sim_input()
        t0 = time.monotonic()
        fast = predicted(simulate(inp))
        t1 = time.monotonic()
        full = predicted(simulate(dataclasses.replace(inp, exhaustive=True)))
        t2 = time.monotonic()
        worst = max(abs(fast[k] - v) / abs(v) for k, v in full.items()
                    if isinstance(v, float) and v)
        rows.append({"check": f"fast vs full, {pp * dp} ranks ({placement})",
                     "configured": f"≤ {TARGET_AGREE:.1%}", "measured":
                     f"{worst:.2e} (fast {t1 - t0:.2f} s, full {t2 - t1:.2f} s, "
                     f"{(t2 - t1) / (t1 - t0):.1f}× faster)",
                     "verdict": "PASS" if worst <= TARGET_AGREE else "FAIL"})
        print(rows[-1]["check"], rows[-1]["measured"], flush=True)
    return rows


def emulated_vs_simulated(tmp: Path) -> list[dict]:
    """Run whatif-overlap.yaml; one check per cell: measured vs predicted iteration time."""
    if os.geteuid() != 0:
        print("emulated vs simulated: not run (needs root: namespaces, tc)", flush=True)
        return [{"check": "emulated vs simulated, 4 to 64 ranks", "configured":
                 f"±{FIDELITY_PCT:g} % per cell", "measured": "not run (needs root)",
                 "verdict": "FAIL (not run)"}]
    t0 = time.monotonic()
    df, _ = run_experiment(OVERLAP, tmp / "overlap")
    table, rows, errors = [], [], []
    for _, r in df.iterrows():
        pp, dp = int(r["workload.parallel.pp"]), int(r["workload.parallel.dp"])
        name = f"emulated vs simulated, {pp * dp} ranks (pp={pp} × dp={dp})"
        if r["status"] != "ok":
            rows.append({"check": name, "configured": f"±{FIDELITY_PCT:g} %",
                         "measured": f"{r['status']}: {r['error']}", "verdict": "FAIL"})
            continue
        got, want = r["iteration_time_s"], r["predicted_iteration_time_s"]
        err = 100 * (got / want - 1)
        errors.append(err)
        table.append({"ranks": pp * dp, "pp × dp": f"{pp} × {dp}", "measured s": f"{got:.4f}",
                      "predicted s": f"{want:.4f}", "error": f"{err:+.2f} %",
                      "queue drops": r["queue_drops"], "fidelity": r["fidelity"]})
        rows.append({"check": name, "configured": f"±{FIDELITY_PCT:g} %",
                     "measured": f"{err:+.2f} %", "verdict": "PASS"
                     if abs(err) <= FIDELITY_PCT else "FAIL"})
    print(f"emulated vs simulated: {len(df)} cells of {OVERLAP.name} in "
          f"{time.monotonic() - t0:.0f} s", flush=True)
    print_table(table, ["ranks", "pp × dp", "measured s", "predicted s", "error",
                        "queue drops", "fidelity"])
    if errors:
        mean = sum(abs(e) for e in errors) / len(errors)
        worst = max(errors, key=abs)
        print(f"mean |error| {mean:.2f} %, largest {worst:+.2f} % over {len(errors)} cells\n",
              flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_save(ap)
    ap.add_argument("--cells", type=int, default=1000,
                    help="cells in the sweep (default 1,000; fewer: the time is projected)")
    ap.add_argument("--full", action="store_true", help="also simulate 100,000 ranks")
    ap.add_argument("--no-emulate", action="store_true",
                    help="skip the emulated-vs-simulated cells (root, a few minutes)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, saved("bench_whatif", args.save) as out:
        rows = sizes(Path(tmp), args.full) + sweep(Path(tmp), args.cells) + agreement(Path(tmp))
        if not args.no_emulate:
            rows += emulated_vs_simulated(Path(tmp))
        fails = print_verdicts(rows, ["check", "configured", "measured", "verdict"])
        out.rows(rows)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
