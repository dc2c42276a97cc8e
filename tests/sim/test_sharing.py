"""WAN sharing among the pipelines of several replicas (testbed/plan/sharing.py and the
simulator): temporal staggers the replicas by one activation's time on the shared link, fair
starts them together and their simultaneous transfers queue on the link."""
from __future__ import annotations

import pytest

from testbed.plan import plan_cell
from testbed.sim.engine import simulate
from testbed.spec import load_experiment

EXPERIMENT = """\
name: share
topology:
  name: share
  dcs: [{name: sa, hosts: 4}, {name: sb, hosts: 4}]
  inter_dc: {delay_ms: 10, rate_mbit: 100, queue: {bytes: 4000000}}
workload:
  model: {layers: 2, hidden: 1024, heads: 8, seq_len: 64, vocab: 1024}
  parallel: {pp: 2, dp: %(dp)s}
  schedule: 1f1b
  microbatches: 8
  compute: {forward_ms: 50, backward_ms: 100}
  wan_sharing: %(policy)s
placement: %(placement)s
"""


def _plan(tmp_path, policy: str, dp: int = 2, placement: str = "in_order"):
    path = tmp_path / "share.yaml"
    path.write_text(EXPERIMENT % dict(policy=policy, dp=dp, placement=placement))
    return plan_cell(load_experiment(path).cells[0])


def _first_transfers(plan) -> list[tuple[float, float]]:
    """(sent, received) of each replica's first forward message over the WAN."""
    res = simulate(plan.sim_input())
    pp, dp = plan.experiment.workload.parallel.pp, plan.experiment.workload.parallel.dp
    out = []
    for d in range(dp):
        sent = next(sp.t0 for sp in res.spans if sp.rank == d * pp and sp.kind == "SEND_F"
                    and sp.microbatch == 0)
        got = next(sp.t1 for sp in res.spans if sp.rank == d * pp + 1 and sp.kind == "RECV_F"
                   and sp.microbatch == 0)
        out.append((sent, got))
    return out


def test_temporal_staggers_replicas_by_one_activation_on_the_shared_link(tmp_path):
    plan = _plan(tmp_path, "temporal")
    slot = plan.paths.path(plan.slots[0], plan.slots[1]).serialization_s(plan.costs.message_bytes)
    assert slot > 0.02  # 256 KiB at 100 Mbit/s
    assert plan.start_offsets == {2: pytest.approx(slot), 3: pytest.approx(slot)}
    assert plan.cell_file().start_offsets_s == plan.start_offsets
    res = simulate(plan.sim_input())
    first = {sp.rank: sp.t0 for sp in sorted(res.spans, key=lambda x: -x.t0)}
    assert first[2] >= slot and first[0] < 0.001  # replica 1 starts one slot late
    # fair, or a placement whose pipelines share no link: nobody waits
    assert _plan(tmp_path, "fair").start_offsets == {}
    assert _plan(tmp_path, "temporal", placement="dp_across_dcs").start_offsets == {}


@pytest.mark.parametrize("dp", [2, 3])
def test_fair_pipelines_queue_behind_each_other_temporal_ones_take_turns(tmp_path, dp):
    fair, temporal = _plan(tmp_path, "fair", dp), _plan(tmp_path, "temporal", dp)
    slot = temporal.start_offsets[temporal.experiment.workload.parallel.pp]
    path = fair.paths.path(fair.slots[0], fair.slots[1])
    burst_s = path.serialization_s(path.burst_bytes)  # what the idle link's bucket passes
    # fair: the replicas' first forward messages are sent together and queue on the link
    # (first come, first served, as measured): the last one arrives dp slots after it left,
    # less the first one's burst, plus the 10 ms delay
    last = max(got - sent for sent, got in _first_transfers(fair))
    assert last == pytest.approx(dp * slot - burst_s + 0.010, abs=0.002)
    # temporal: each replica's first message has the link to itself (its slot, the 10 ms
    # delay and the software latency)
    for sent, got in _first_transfers(temporal):
        assert got - sent < slot + 0.0125, (sent, got)
