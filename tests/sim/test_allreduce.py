"""The simulator's DP all-reduce: the ring the emulated executor runs (testbed/train/ring.py),
2(d−1) transfer steps of gradient bytes / d over the slowest ring edge, plus d−1 modelled
reductions that the executor sleeps."""
from __future__ import annotations

import pytest

from testbed.plan import plan_cell
from testbed.sim import calibration as C
from testbed.sim.inputs import allreduce_s
from testbed.spec import load_experiment
from testbed.spec.costs import GPU_REDUCE_BYTES_PER_S, ring_chunk_bytes

EXPERIMENT = """\
name: ring
topology:
  name: ring
  dcs: [{name: ra, hosts: 3, intra: {rate_mbit: 1000, delay_ms: 1}}]
workload:
  model: {layers: 2, hidden: 64, heads: 4, seq_len: 64, vocab: 128}
  parallel: {pp: 1, dp: 3}
  schedule: gpipe
  microbatches: 2
  compute: {forward_ms: 10, backward_ms: 20}
"""


def test_ring_steps_and_modelled_reductions(tmp_path):
    path = tmp_path / "ring.yaml"
    path.write_text(EXPERIMENT)
    plan = plan_cell(load_experiment(path).cells[0])
    grad = 3 * 10**9  # reductions of 1 GB chunks are visible next to their transfers
    (got,) = allreduce_s(plan.paths, plan.slots, 1, 3, [grad])
    chunk = ring_chunk_bytes(grad, 3)
    edge = plan.paths.path(plan.slots[0], plan.slots[1])
    step = edge.serialization_s(chunk) + edge.delay_s + C.MESSAGE_LATENCY_S
    reduce = chunk / GPU_REDUCE_BYTES_PER_S + C.SLEEP_OVERSHOOT_S
    assert got == pytest.approx(4 * step + 2 * reduce, rel=1e-9)
    assert 2 * reduce > 0.003  # the reduction's share is not lost in the rounding
    assert allreduce_s(plan.paths, plan.slots, 1, 1, [grad]) == [0.0]
