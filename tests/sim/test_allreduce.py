"""The simulator's DP all-reduce (testbed/sim/collective.py): the ring steps the workers run
(testbed/spec/allreduce.py) as transfers on the links' FIFOs, beside the pipeline's."""
from __future__ import annotations

import dataclasses

import pytest

from testbed.plan import plan_cell
from testbed.sim import calibration as C
from testbed.sim.engine import simulate
from testbed.sim.inputs import collective_steps
from testbed.spec import load_experiment
from testbed.spec.costs import FLOAT32_BYTES, GPU_REDUCE_BYTES_PER_S

EXPERIMENT = """\
name: ring
topology:
  name: ring
  dcs: [{name: ra, hosts: 4, intra: {rate_mbit: 1000, delay_ms: 1}}, {name: rb, hosts: 4}]
  inter_dc: {delay_ms: 20, rate_mbit: 100}
workload:
  model: {layers: 4, hidden: 64, heads: 4, seq_len: 64, vocab: 128}
  parallel: {pp: %(pp)s, dp: %(dp)s}
  schedule: %(schedule)s
  chunks: %(chunks)s
  microbatches: 4
  compute: {forward_ms: 10, backward_ms: 20}
  gradient_sync: {algorithm: %(algorithm)s, overlap: %(overlap)s}
placement: %(placement)s
"""


def _plan(tmp_path, pp=1, dp=3, algorithm="ring", overlap="false", placement="in_order",
          schedule="gpipe", chunks=1):
    path = tmp_path / "ring.yaml"
    path.write_text(EXPERIMENT % dict(pp=pp, dp=dp, algorithm=algorithm, overlap=overlap,
                                      placement=placement, schedule=schedule, chunks=chunks))
    return plan_cell(load_experiment(path).cells[0])


def _with_gradients(plan, numel: int, stages=None):
    """The plan's simulator input with ``numel`` gradient elements on ``stages`` (default
    all; the others have none)."""
    inp = plan.sim_input()
    s = plan.schedule
    grads = [numel if stages is None or st in stages else 1 for st in range(s.n_stages)]
    sync = plan.experiment.workload.gradient_sync
    steps = collective_steps(plan.slots, s, grads, sync.algorithm, None)
    if stages is not None:
        steps = {r: {st: v for st, v in per.items() if st in stages} for r, per in steps.items()}
    return dataclasses.replace(inp, collectives=steps)


def _allreduce_wait(res, rank: int) -> float:
    return sum(sp.t1 - sp.t0 for sp in res.spans
               if sp.rank == rank and sp.kind == "ALLREDUCE_WAIT")


def test_ring_steps_and_modelled_reductions(tmp_path):
    plan = _plan(tmp_path)
    numel = 3 * 10**9 // FLOAT32_BYTES  # reductions of 1 GB chunks show beside the transfers
    res = simulate(_with_gradients(plan, numel))
    chunk = numel // 3 * FLOAT32_BYTES
    edge = plan.paths.path(plan.slots[0], plan.slots[1])
    # each step: the receive's notification (one delay, over which the shaper's token bucket
    # refills), the chunk's serialization less the bucket's burst, its delay
    burst = min(C.shaper_burst_bytes(edge.rate_bps), edge.delay_s * edge.rate_bps / 8)
    step = edge.delay_s + edge.serialization_s(chunk - burst) + edge.delay_s \
        + C.MESSAGE_LATENCY_S
    reduce = chunk / GPU_REDUCE_BYTES_PER_S + C.SLEEP_OVERSHOOT_S
    assert _allreduce_wait(res, 0) == pytest.approx(4 * step + 2 * reduce, rel=1e-6)
    assert 2 * reduce > 0.003  # the reduction's share is not lost in the rounding
    steps = [sp for sp in res.spans if sp.rank == 0 and sp.kind == "ALLREDUCE_STEP"]
    assert len(steps) == 4


def test_all_reduces_that_cross_one_link_direction_take_turns(tmp_path):
    # whole pipelines in each DC, the replicas across the WAN: both stages' rings cross the
    # 100 Mbit/s link in the same direction; together they take about twice one alone
    plan = _plan(tmp_path, pp=2, dp=2, placement="dp_across_dcs")
    assert plan.grid == [["ra", "ra"], ["rb", "rb"]]
    numel = 25_000_000 // FLOAT32_BYTES  # 12.5 MB per step: 1 s on the WAN link
    both = simulate(_with_gradients(plan, numel))
    alone = simulate(_with_gradients(plan, numel, stages={0}))
    t_both, t_alone = _allreduce_wait(both, 0), _allreduce_wait(alone, 0)
    assert t_alone > 2.0 and t_both > 1.8 * t_alone, (t_alone, t_both)


def test_hierarchical_crosses_the_wan_fewer_times(tmp_path):
    # four replicas, two per DC: the flat ring pays the WAN's delay in all 6 steps, the
    # hierarchical all-reduce in the 2 steps between DCs
    grid = "{map: [[ra], [rb], [ra], [rb]]}"
    ring = _plan(tmp_path, dp=4, placement=grid)
    hier = _plan(tmp_path, dp=4, placement=grid, algorithm="hierarchical")
    t_ring = ring.prediction["predicted_iteration_time_s"]
    t_hier = hier.prediction["predicted_iteration_time_s"]
    assert t_ring - t_hier > 4 * 2 * 0.020, (t_ring, t_hier)


def test_overlap_hides_an_early_stages_all_reduce(tmp_path):
    # interleaved: each rank's later virtual stage finishes its backwards well before the
    # rank's last action; with overlap its all-reduce runs beside the rest of the pipeline
    kw = dict(pp=2, dp=2, schedule="interleaved_1f1b", chunks=2)
    on, off = _plan(tmp_path, overlap="true", **kw), _plan(tmp_path, overlap="false", **kw)
    t_on = on.prediction["predicted_iteration_time_s"]
    t_off = off.prediction["predicted_iteration_time_s"]
    assert t_on < t_off, (t_on, t_off)
    for plan, early in ((on, True), (off, False)):
        spans = [sp for sp in simulate(plan.sim_input()).spans if sp.rank == 0]
        last_compute = max(sp.t1 for sp in spans if sp.cat == "compute")
        first_step = min(sp.t0 for sp in spans if sp.kind == "ALLREDUCE_STEP")
        assert (first_step < last_compute) is early, (first_step, last_compute)
