"""DiLoCo with real compute and a narrow outer dtype, through the runner on the netns backend:
the outer all-reduce really sends int8 (a quarter of fp32's bytes, read from the WAN
interfaces' counters), the replicas still agree, and the training is the fp32 run's within
the quantization's rounding."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from runexp import run_experiment
from testbed.readout.traces import load_traces
from testbed.spec.gradsync import OUTER_WARM_UP_ROUNDS

pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.slow]
ITERATIONS, INNER_STEPS = 9, 3
# per direction and iteration, the counted bytes less the frames' headers against the outer
# all-reduces' payload: left in it are int8's 4-byte scale per chunk, gloo's message headers,
# the rendezvous and the start syncs
BYTES_PCT = 2.0

EXPERIMENT = f"""\
name: rdt
topology:
  name: rdt
  dcs: [{{name: rda, hosts: 1}}, {{name: rdb, hosts: 1}}]
  inter_dc: {{delay_ms: 10, rate_mbit: 500}}
workload:
  model: {{layers: 2, hidden: 128, heads: 4, seq_len: 32, vocab: 256}}
  parallel: {{pp: 1, dp: 2}}
  schedule: gpipe
  microbatches: 2
  compute: {{mode: real}}
  gradient_sync: {{mode: diloco, inner_steps: {INNER_STEPS}}}
  iterations: {ITERATIONS}
  warmup: 1
placement: dp_across_dcs
matrix:
  workload.gradient_sync.outer_dtype: [fp32, int8]
measure_links: false
timeout_s: 180
"""


def _losses(cell_dir: Path) -> dict[int, list[float]]:
    """Each rank's loss per iteration (its ``iter`` records)."""
    traces = load_traces(cell_dir)
    return {r: [x["loss"] for x in recs if x.get("type") == "iter"] for r, recs in traces.items()}


def test_real_diloco_in_int8_sends_a_quarter_of_the_bytes_and_trains_as_fp32_does(tmp_path):
    run = run_experiment(EXPERIMENT, tmp_path, "--quiet")
    rows = pd.read_csv(run / "results.csv").set_index("outer_dtype")
    syncs = OUTER_WARM_UP_ROUNDS + ITERATIONS // INNER_STEPS  # warm-up rounds and sync steps
    losses = {}
    for dtype, row in rows.iterrows():
        assert row["status"] == "ok", row["error"]
        # a ring of two: each direction carries one replica's pseudo-gradient per sync
        payload = syncs * row["outer_sync_payload_bytes"] * 2 / ITERATIONS
        sent = row["wan_bytes_per_step_measured"] - row["wan_headers_per_step_measured"]
        assert abs(100 * (sent / payload - 1)) <= BYTES_PCT, (dtype, sent, payload)
        losses[dtype] = _losses(run / "cells" / row["cell_id"])
    assert rows.loc["int8", "outer_sync_payload_bytes"] * 4 == rows.loc[
        "fp32", "outer_sync_payload_bytes"]
    for dtype, per_rank in losses.items():
        first, second = per_rank.values()
        assert first == second, dtype  # the replicas train on the same batches and agree
        assert first[-1] < 0.8 * first[0], (dtype, first)
    fp32, int8 = losses["fp32"][0], losses["int8"][0]
    assert fp32[:INNER_STEPS] == int8[:INNER_STEPS]  # before the first outer step
    assert fp32 != int8  # the outer steps differ by int8's rounding ...
    assert int8 == pytest.approx(fp32, rel=0.01)  # ... and only by it
