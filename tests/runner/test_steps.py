"""A run whose inter-DC delay steps up in the middle, as root on real namespaces with real
workers: the per-iteration series shows both phases with the delay in force, the step lands
at the iteration it names, and the row's prediction covers the same phases."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from prediction import check_prediction

# alone: the iterations' times per phase and their prediction are measured time
pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.alone]
ROOT = Path(__file__).resolve().parents[2]
STEP = ROOT / "tests" / "runner" / "exps" / "step.yaml"
LINK = "link_dcs-dct_"
# Prediction vs measured median: the acceptance's 5 %. Measured 0.1-0.5 % apart on this
# machine (a model without gloo's receive-ready handshake was 4 % short in the 40 ms phase)
PREDICTION_TOLERANCE = 0.05


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("results")
    res = subprocess.run([sys.executable, "-m", "testbed", "run", str(STEP), "--results",
                          str(results)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ))
    assert res.returncode == 0, res.stdout + res.stderr
    (d,) = list((results / "step").iterdir())
    return d


def test_iterations_csv_shows_both_phases_with_the_delay_in_force(run_dir):
    (cell,) = list((run_dir / "cells").iterdir())
    it = pd.read_csv(cell / "iterations.csv")
    assert list(it["iteration"]) == list(range(1, 10))  # warm-up left out
    assert it["start_s"].is_monotonic_increasing and (it["start_s"] > 0).all()
    before, after = it[it["iteration"] < 4], it[it["iteration"] > 4]
    assert set(before[LINK + "delay_ms"]) == {5.0} and set(after[LINK + "delay_ms"]) == {40.0}
    assert set(before["phase"]) == {0} and set(after["phase"]) == {1}
    # 1F1B on 2 stages crosses the link at least twice per iteration: +35 ms each time
    assert after["iteration_time_s"].median() - before["iteration_time_s"].median() > 2 * 0.035
    (step,) = json.loads((cell / "steps.json").read_text())
    fourth = it.set_index("iteration").loc[3]
    # asked for once rank 0's trace showed iteration 3 done, before iteration 5 started
    assert fourth["start_s"] + fourth["iteration_time_s"] <= step["requested_s"]
    assert step["requested_s"] < it.set_index("iteration").loc[5]["start_s"]


def test_the_rows_prediction_covers_the_same_phases(run_dir):
    row = pd.read_csv(run_dir / "results.csv").iloc[0]
    (cell,) = list((run_dir / "cells").iterdir())
    it = pd.read_csv(cell / "iterations.csv")
    first_phase = it[it["phase"] == 0]["predicted_iteration_time_s"].iloc[0]
    measured, predicted = row["iteration_time_s"], row["predicted_iteration_time_s"]
    check_prediction(row, abs(predicted - measured) / measured < PREDICTION_TOLERANCE)
    # the first phase's prediction alone (what the row said before phases) is far off
    assert abs(first_phase - measured) / measured > 2 * PREDICTION_TOLERANCE


def test_summary_reports_each_phase_and_plots_the_series(run_dir):
    summary = (run_dir / "summary.md").read_text()
    assert "## Phases" in summary and "| 40 |" in summary
    assert list((run_dir / "plots").glob("iterations_*.png"))
