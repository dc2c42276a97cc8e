"""A dp = 2 cell through the runner on the netns backend: the emulated all-reduce's bytes
cross the shaped intra-DC links and the measured iteration time stays near the simulator's
prediction, which models the same ring (testbed/sim/inputs.py allreduce_s)."""
from __future__ import annotations


import pandas as pd
import pytest

from prediction import check_prediction
from runexp import run_experiment
from testbed.readout.traces import load_traces

# alone: measured against predicted is measured time
pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.slow, pytest.mark.alone]
# predicted / measured iteration time: the band the runner tests use for a busy 2-core
# machine (the measurement is slower when other work competes for the cores). Here the
# all-reduce is about half the iteration, so leaving it out of either side breaks the band.
RATIO_BAND = (0.75, 1.1)

# pp = 2 over two DCs, dp = 2 inside each: about 27 MB of gradients per stage, so each ring
# step (13.7 MB) takes about 115 ms on the 1 Gbit/s host links, 2 steps after the pipeline's
# (4 + 1) × 30 ms.
EXPERIMENT = """\
name: dpring
topology:
  name: dpring
  dcs:
    - {name: dra, hosts: 2, intra: {rate_mbit: 1000}}
    - {name: drb, hosts: 2, intra: {rate_mbit: 1000}}
  inter_dc: {delay_ms: 5, rate_mbit: 1000}
workload:
  model: {layers: 4, hidden: 512, heads: 8, seq_len: 64, vocab: 1024}
  parallel: {pp: 2, dp: 2}
  schedule: 1f1b
  microbatches: 4
  compute: {mode: emulated, forward_ms: 10, backward_ms: 20}
  iterations: 5
  warmup: 1
measure_links: false
timeout_s: 180
"""


def test_dp2_netns_cell_measures_near_its_prediction(tmp_path):
    run = run_experiment(EXPERIMENT, tmp_path)
    row = pd.read_csv(run / "results.csv").iloc[0]
    assert row["status"] == "ok", row["error"]
    ratio = row["predicted_iteration_time_s"] / row["iteration_time_s"]
    check_prediction(row, RATIO_BAND[0] <= ratio <= RATIO_BAND[1])
    traces = load_traces(run / "cells" / row["cell_id"])
    steps = [r for recs in traces.values() for r in recs
             if r["type"] == "action" and r["kind"] == "ALLREDUCE_STEP" and r["iter"] == 1]
    assert len(steps) == 4 * 2 and min(r["bytes"] for r in steps) > 13_000_000, steps
