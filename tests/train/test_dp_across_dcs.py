"""Data parallelism across DCs through the runner on the netns backend: four replicas in two
DCs (an explicit placement map), all-reduced with a flat ring and hierarchically. The
emulated all-reduce's chunks cross the shaped WAN link; the measured iteration time stays near
the simulator's prediction (testbed/sim/collective.py), and hierarchical, which pays the WAN's
delay in 2 steps instead of 6, is faster in both."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from prediction import check_prediction
from runexp import run_experiment
from testbed.cell.cellfile import CellFile
from testbed.readout.traces import load_traces
from testbed.spec.allreduce import rank_steps
from testbed.spec.costs import FLOAT32_BYTES

# alone: measured against predicted is measured time
pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.slow, pytest.mark.alone]
# predicted / measured iteration time on a busy 2-core machine (as test_emulated_dp.py)
RATIO_BAND = (0.75, 1.1)
# bytes a WAN interface counted against the payload the plan sends that way plus the headers
# of the frames it counted (ACKs of the other direction included): issue 26's 2 %. Left in
# it: gloo's message headers, rendezvous, start sync and connection warm-up, over 4 iterations
BYTES_PCT = 2.0

# 840 KB of gradients (bytes_scale 0.1): the flat ring's 6 steps of 210 KB each pay the
# receive's notification and the chunk's trip over the 20 ms link (about 50 ms a step); the
# hierarchical all-reduce crosses it in 2 steps. The WAN queue holds every chunk in flight,
# so TCP loses nothing the simulator would not know about.
EXPERIMENT = """\
name: dpwan
topology:
  name: dpwan
  dcs: [{name: dwa, hosts: 2}, {name: dwb, hosts: 2}]
  inter_dc: {delay_ms: 20, rate_mbit: 200, queue: {bytes: 4000000}}
workload:
  model: {layers: 2, hidden: 256, heads: 8, seq_len: 64, vocab: 1024}
  parallel: {pp: 1, dp: 4}
  schedule: gpipe
  microbatches: 2
  compute: {mode: emulated, forward_ms: 5, backward_ms: 10, bytes_scale: 0.1}
  iterations: 4
  warmup: 1
placement:
  map: [[dwa], [dwb], [dwa], [dwb]]
matrix:
  workload.gradient_sync.algorithm: [ring, hierarchical]
measure_links: false
timeout_s: 180
"""


def test_dp_across_two_dcs_ring_and_hierarchical_measure_near_their_predictions(tmp_path):
    run = run_experiment(EXPERIMENT, tmp_path)
    rows = pd.read_csv(run / "results.csv").set_index("gradient_sync")
    assert set(rows["placement_map"]) == {"dwa | dwb | dwa | dwb"}
    assert set(rows["placement"]) == {"map"}
    for algorithm, row in rows.iterrows():
        assert row["status"] == "ok", row["error"]
        ratio = row["predicted_iteration_time_s"] / row["iteration_time_s"]
        check_prediction(row, RATIO_BAND[0] <= ratio <= RATIO_BAND[1], algorithm)
        _steps_as_planned(run / "cells" / row["cell_id"], algorithm)
        for src in ("dwa", "dwb"):  # the interface counters against the plan's payload
            col = f"link_dwa-dwb_from_{src}_bytes_per_iter_"
            measured, planned = row[col + "measured"], row[col + "planned"]
            headers = row[f"link_dwa-dwb_from_{src}_headers_per_iter_measured"]
            assert 0 < headers < 0.1 * planned, (algorithm, src, headers, planned)
            assert abs(100 * (measured / (planned + headers) - 1)) <= BYTES_PCT, \
                (algorithm, src, measured, planned, headers)
        assert row["allreduce_exposed_s"] > 0.5 * row["predicted_allreduce_exposed_s"]
    ring, hier = rows.loc["ring"], rows.loc["hierarchical"]
    assert hier["predicted_iteration_time_s"] < ring["predicted_iteration_time_s"] - 0.1
    assert hier["iteration_time_s"] < ring["iteration_time_s"] - 0.1


def _steps_as_planned(cell_dir: Path, algorithm: str) -> None:
    """Every rank's traced all-reduce steps of a measured iteration are the planned ones:
    same peers, same bytes, in order."""
    cell = CellFile.read(cell_dir / "cell.json")
    for rank, recs in load_traces(cell_dir).items():
        steps = [r for r in recs if r["type"] == "action" and r["kind"] == "ALLREDUCE_STEP"
                 and r["iter"] == 2]
        started = next(r for r in recs if r["type"] == "action" and r["kind"] == "ALLREDUCE")
        planned = rank_steps(cell.placement, rank, started["bytes"] // FLOAT32_BYTES,
                             algorithm)
        assert [(r["peer"], r["bytes"]) for r in steps] == \
            [(s.send_to, s.numel * FLOAT32_BYTES) for s in planned], (rank, algorithm)
