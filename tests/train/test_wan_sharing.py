"""Two replicas' pipelines over one emulated WAN link through the runner (netns): fair (they
start together) against temporal (the second starts one activation's time late, so their
transfers take turns). Every measured iteration starts each replica as planned, and fair
measures near its prediction. On this emulator, with a queue that holds the bursts, fair's
simultaneous transfers went one after the other (FIFO) rather than sharing the rate, so the
pipelines staggered themselves after the first transfer: measured 1.62 s fair and 1.59 s
temporal, both predicted 1.67 s (one run, busy machine)."""
from __future__ import annotations

import statistics

import pandas as pd
import pytest

from prediction import check_prediction
from runexp import run_experiment
from testbed.cell.cellfile import CellFile
from testbed.readout.traces import load_traces

# alone: each replica's start offset within 4 ms, and measured against predicted is measured time
pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.slow, pytest.mark.alone]
RATIO_BAND = (0.75, 1.1)  # predicted / measured on a busy 2-core machine (test_emulated_dp.py)

# 256 KiB activations take 22 ms on the 100 Mbit/s link, F = 50 ms: room for two replicas
EXPERIMENT = """\
name: wanshare
topology:
  name: wanshare
  dcs: [{name: wsa, hosts: 2}, {name: wsb, hosts: 2}]
  inter_dc: {delay_ms: 10, rate_mbit: 100, queue: {bytes: 4000000}}
workload:
  model: {layers: 2, hidden: 1024, heads: 8, seq_len: 64, vocab: 1024}
  parallel: {pp: 2, dp: 2}
  schedule: 1f1b
  microbatches: 8
  compute: {mode: emulated, forward_ms: 50, backward_ms: 100}
  iterations: 4
  warmup: 1
matrix:
  workload.wan_sharing: [fair, temporal]
measure_links: false
timeout_s: 180
"""


def test_fair_and_temporal_sharing_measure_near_their_predictions(tmp_path):
    run = run_experiment(EXPERIMENT, tmp_path)
    rows = pd.read_csv(run / "results.csv").set_index("workload.wan_sharing")
    assert set(rows["status"]) == {"ok"}, rows["error"]
    fair = rows.loc["fair"]
    ratio = fair["predicted_iteration_time_s"] / fair["iteration_time_s"]
    check_prediction(fair, RATIO_BAND[0] <= ratio <= RATIO_BAND[1], "fair")
    # replica 1 started as planned: with fair at once, with temporal one slot (22 ms) after
    # replica 0. The offset of each measured iteration is the difference of two ranks' wake-ups
    # from a sleep, each late by its own scheduling on a busy 2-core machine (one iteration
    # was 4.7 ms off in a full suite run); the median of the three is held within 4 ms
    for policy, row in rows.iterrows():
        cell = run / "cells" / row["cell_id"]
        planned = CellFile.read(cell / "cell.json").start_offsets_s.get(2, 0.0)
        assert (planned > 0.02) == (policy == "temporal")
        traces = load_traces(cell)
        offsets = []
        for it in (1, 2, 3):
            t0 = {r: next(x["t0"] for x in recs if x["type"] == "iter" and x["iter"] == it)
                  for r, recs in traces.items()}
            offsets.append((t0[2] - t0[0]) / 1e9)
        assert abs(statistics.median(offsets) - planned) < 0.004, (policy, offsets, planned)
