"""A user's program measured right, whatever way it is written: the row's iteration time is
within 3 % of the program's own steady-state step time and its bubble within 2 points of the
bubble computed from the program's own per-rank compute records over the same period.

The programs (examples/plain_pipeline.py, tests/runner/programs/user_ddp.py) are plain
torch.distributed scripts written without testbed in mind, each printing its own per-step
start, duration and compute:
GPipe without a barrier (ranks drift apart), 1F1B with a barrier, interleaved 1F1B (two
stages per rank), DDP with no pipelining (``iteration()`` marks), and DDP reporting only in
its output (``iteration_regex``). Root (namespaces), torch (real processes)."""
from __future__ import annotations

import csv
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

# Alone: the row and the program's own times come from one run, but beside other tests on a
# saturated box (every row marked degraded, CPU busy 100 %) single steps varied by ±15 % and the
# row's period (from the schedule's step start, after the barrier) and the program's own step
# time (from the top of its loop, before it) drew 3.2 % apart for 1F1B with a barrier
# (1.634339 s against 1.583957 s, results/suite/xdist-timing.md).
pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.slow, pytest.mark.alone,
              pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).parent / "programs"
EXAMPLES = ROOT / "examples"
# the targets: iteration time within 3 % of the program's own, bubble within 2 points
ITERATION_REL, BUBBLE_PP = 0.03, 0.02
# 10 measured steps: a DDP step varies by ±10 % here, and a median of 5 (4 periods between marks)
# against the program's own 20 once drew 3.8 % apart on an idle machine
STEPS, WARMUP = 12, 2
MICROBATCHES = 4
LINE = re.compile(r"step (\d+) start ([0-9.]+) time ([0-9.]+) compute ([0-9.]+)")

# The program counts as its compute only the sleeps inside its stages; the stage's own work
# around them (its Linear, torch's pipelining bookkeeping: about 0.5 ms per forward and 0.6 ms
# per backward here) is compute to testbed too. At 20/40 ms that put the row's bubble 1.0–1.5
# points under the program's, leaving the 2-point target half a point for noise (CI once
# measured 2.3); at 40/80 ms the same work is half as many points.
# 4 microbatches: a GPipe step takes m + p - 1 = 7 compute slots, against 11 with the program's
# default 8 (the module's run: 58.6 s against 84.1 s); both sides of each check see the same m
PIPE = (f"[python, {EXAMPLES}/plain_pipeline.py, --steps, '{STEPS}', "
        f"--microbatches, '{MICROBATCHES}', "
        "--forward-ms, '40', --backward-ms, '80'")
DDP = f"[python, {PROGRAMS}/user_ddp.py, --steps, '{STEPS}'"
STYLES = {  # name → (pp, dp, program)
    "gpipe": (4, 1, f"{{argv: {PIPE}, --schedule, gpipe]}}"),
    "1f1b-barrier": (4, 1, f"{{argv: {PIPE}, --schedule, 1f1b, --barrier]}}"),
    "interleaved": (4, 1, f"{{argv: {PIPE}, --schedule, interleaved]}}"),
    "ddp-marked": (1, 4, f"{{argv: {DDP}, --mark]}}"),
    "ddp-printed": (1, 4, f"{{argv: {DDP}], iteration_regex: 'time (?P<seconds>[0-9.]+)'}}"),
}
EXP = """name: styles
backend: netns
topology: {root}/topologies/two-dc.yaml
links:
  inter_dc: {{delay_ms: 5, rate_mbit: 1000}}
measure_links: false
timeout_s: 120
workload:
  parallel: {{pp: 4, dp: 1}}
  microbatches: {microbatches}
  iterations: {steps}
  warmup: {warmup}
  program: {{argv: [python, x.py]}}
matrix:
  zip:
    - workload.parallel.pp: [{pps}]
      workload.parallel.dp: [{dps}]
      workload.program:
{programs}
"""


def _own(cell: Path, ranks: int) -> tuple[float, float]:
    """The program's own steady-state step time and bubble, over the steps the row measured
    (its iterations.csv: on the period basis, every measured step with a next one). The time
    is aggregated as the row aggregates its own: the median over those steps of the mean over
    ranks (a median over every rank's every step drew 2.9 % apart from it once, as a DDP step
    varies by ±10 % here). The bubble: per rank and step, 1 − compute / start-to-next-start."""
    with open(cell / "iterations.csv", newline="", encoding="utf-8") as f:
        measured = [int(row["iteration"]) for row in csv.DictReader(f)]
    assert measured and min(measured) >= WARMUP, measured
    per_step, bubbles = {k: [] for k in measured}, []
    for r in range(ranks):
        steps = {int(m[1]): (float(m[2]), float(m[3]), float(m[4]))
                 for m in LINE.finditer((cell / f"worker-rank{r}.log").read_text())}
        assert sorted(steps) == list(range(STEPS)), steps
        for k in measured:
            per_step[k].append(steps[k][1])
            if k + 1 < STEPS:
                bubbles.append(1 - steps[k][2] / (steps[k + 1][0] - steps[k][0]))
    return (statistics.median(statistics.fmean(t) for t in per_step.values()),
            statistics.fmean(bubbles))


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> pd.DataFrame:
    tmp = tmp_path_factory.mktemp("styles")
    exp = tmp / "styles.yaml"
    exp.write_text(EXP.format(
        root=ROOT, steps=STEPS, warmup=WARMUP, microbatches=MICROBATCHES,
        pps=", ".join(str(s[0]) for s in STYLES.values()),
        dps=", ".join(str(s[1]) for s in STYLES.values()),
        programs="\n".join(f"        - {s[2]}" for s in STYLES.values())), encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "testbed", "run", str(exp), "--results",
                        str(tmp / "res"), "--quiet"], cwd=ROOT, capture_output=True, text=True,
                       timeout=800)
    assert r.returncode == 0, r.stdout + r.stderr
    (run,) = (tmp / "res" / "styles").iterdir()
    df = pd.read_csv(run / "results.csv")
    df["cell"] = [run / "cells" / c for c in df["cell_id"]]
    df.index = list(STYLES)
    return df


@pytest.mark.parametrize("style", list(STYLES))
def test_the_rows_iteration_time_is_the_programs_own(rows, style):
    row = rows.loc[style]
    own_time, _ = _own(row["cell"], 4)
    assert row["iteration_time_s"] == pytest.approx(own_time, rel=ITERATION_REL), \
        (row["iteration_time_s"], own_time)
    expect = {"ddp-printed": "printed"}.get(style, "period")
    assert row["iteration_basis"] == expect and row["exit_status"] == "ok"
    assert (row["cell"] / "iterations.csv").is_file()


@pytest.mark.parametrize("style", ["gpipe", "1f1b-barrier", "interleaved"])
def test_the_rows_bubble_is_the_programs_own(rows, style):
    row = rows.loc[style]
    _, own_bubble = _own(row["cell"], 4)
    assert row["bubble_ratio"] == pytest.approx(own_bubble, abs=BUBBLE_PP), \
        (row["bubble_ratio"], own_bubble)


def test_a_program_without_compute_records_has_no_bubble_and_the_report_still_plots(rows):
    assert rows.loc[["ddp-marked", "ddp-printed"], "bubble_ratio"].isna().all()
    run = rows.iloc[0]["cell"].parents[1]
    assert (run / "summary.md").is_file()
