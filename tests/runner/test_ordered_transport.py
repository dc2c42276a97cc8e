"""The NCCL path of the built-in worker on a machine without a GPU: TESTBED_ORDERED_TRANSPORT=1
runs its transport (one process group per direction between two ranks, no tags, receives
matched by order as NCCL matches them), its warm-up in one global order and its read-back of
one activation across the DC boundary over gloo on CPU tensors, through the runner on a real
2-DC network (root: namespaces, tc). What only a GPU has (CUDA streams, NCCL itself) is in
tests/gpu/test_nccl_gpu.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from prediction import check_prediction

pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]
EXP = """name: ordered
backend: netns
topology:
  name: two
  dcs: [{name: dca, hosts: 1}, {name: dcb, hosts: 1}]
  inter_dc: {delay_ms: 20, rate_mbit: 1000}
measure_links: false
workload:
  model: {layers: 4, hidden: 256, heads: 4, seq_len: 256, vocab: 1000}
  parallel: {pp: 2, dp: 1}
  schedule: 1f1b
  microbatches: 4
  compute: {mode: emulated, forward_ms: 10, backward_ms: 20}
  iterations: 3
  warmup: 1
"""


@pytest.mark.alone  # the read-back and the iteration against their predictions: measured time
@pytest.mark.apart_from_quiet  # the read-back is bound within a millisecond
def test_the_ordered_transport_runs_a_two_dc_pipeline_and_reads_an_activation_back(tmp_path):
    exp = tmp_path / "ordered.yaml"
    exp.write_text(EXP)
    env = {**os.environ, "TESTBED_ORDERED_TRANSPORT": "1"}
    res = subprocess.run([sys.executable, "-m", "testbed", "run", str(exp), "--results",
                          str(tmp_path / "r"), "--quiet"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=280)
    (csv,) = (tmp_path / "r").glob("*/*/results.csv")
    row = pd.read_csv(csv).iloc[0]
    assert row["status"] == "ok", (row["error"], res.stderr[-2000:])
    assert row["dist_backend"] == "gloo"
    # 256 × 256 float32 = 256 KiB: 20 ms one way + 2.2 ms at 1 Gbit/s (frames counted)
    expected = 0.020 + 256 * 256 * 4 * 1514 / 1448 * 8 / 1e9
    assert row["activation_readback_expected_s"] == pytest.approx(expected, abs=1e-6)
    # it crossed the shaped link: never under its delay, and not far over delay + serialisation
    assert 0.020 <= row["activation_readback_s"] < 1.25 * expected, row["activation_readback_s"]
    # the pipeline over it is measured as the simulator predicts (2-core machine: 10 %), or
    # its row names what on this machine ran late (tests/prediction.py)
    check_prediction(row, row["iteration_time_s"] == pytest.approx(
        row["predicted_iteration_time_s"], rel=0.10))
    # the trace keeps each round's two round trips, from which each one-way time was taken
    (trace,) = (tmp_path / "r").glob("*/*/cells/*/trace-rank0.jsonl")
    (rec,) = [r for r in map(json.loads, trace.read_text().splitlines())
              if r["type"] == "readback"]
    assert len(rec["round_trips"]) == len(rec["rounds"]) == 5
    for (big, small), one_way in zip(rec["round_trips"], rec["rounds"]):
        assert big >= 0.040 and small >= 0.040  # two crossings of the 20 ms link each
        assert one_way == pytest.approx(big - small / 2, abs=2e-6)
    # the row's one-way time: the least first round trip less half the least second one (a
    # late release only adds; a suite run's median of the rounds read 19.874 ms)
    bigs, smalls = zip(*rec["round_trips"])
    assert rec["seconds"] == pytest.approx(min(bigs) - min(smalls) / 2, abs=2e-6)


def test_without_the_ordered_transport_gloo_reads_nothing_back(tmp_path):
    exp = tmp_path / "plain.yaml"
    exp.write_text(EXP)
    env = {k: v for k, v in os.environ.items() if k != "TESTBED_ORDERED_TRANSPORT"}
    subprocess.run([sys.executable, "-m", "testbed", "run", str(exp), "--results",
                    str(tmp_path / "r"), "--quiet"], cwd=ROOT, env=env, capture_output=True,
                   text=True, timeout=280)
    (csv,) = (tmp_path / "r").glob("*/*/results.csv")
    row = pd.read_csv(csv).iloc[0]
    assert row["status"] == "ok" and pd.isna(row["activation_readback_s"])
