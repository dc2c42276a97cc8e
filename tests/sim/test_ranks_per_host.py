"""Several ranks per host in the plan and the simulator: a host's ranks share one DC, and
transfers between them take the same-host path (nothing shaped), so a prediction changes when
a stage boundary falls inside a host."""
from __future__ import annotations

import textwrap

import pytest

from testbed.plan import plan_cell
from testbed.sim.engine import simulate
from testbed.sim.paths import SAME_HOST
from testbed.spec import load_experiment

# pp=4 over two DCs of two hosts; each host link (links.intra_dc) is 5 ms one way at
# 100 Mbit/s, so a boundary between two hosts of a DC costs at least 10 ms of delay per hop
# pair plus serialization; with ranks_per_host=2 the boundaries 0|1 and 2|3 are inside a host.
EXP = """\
name: t
topology:
  name: two
  dcs: [{name: a, hosts: 2}, {name: b, hosts: 2}]
  inter_dc: {delay_ms: 10, rate_mbit: 1000}
links:
  intra_dc: {delay_ms: 5, rate_mbit: 100}
workload:
  model: {layers: 8, hidden: 256, heads: 4, seq_len: 128, vocab: 512}
  parallel: {pp: %(pp)s, dp: %(dp)s}
  schedule: 1f1b
  microbatches: 8
  compute: {forward_ms: 10, backward_ms: 20}
matrix:
  workload.ranks_per_host: [1, 2]
"""


def _plans(tmp_path, pp: int = 4, dp: int = 1) -> dict[int, object]:
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(EXP % {"pp": pp, "dp": dp}), encoding="utf-8")
    return {c.params["workload.ranks_per_host"]: plan_cell(c)
            for c in load_experiment(path).cells}


def _allreduce_s(plan) -> list[float]:
    """Each pipeline rank's all-reduce, replica 0: its first step's start to its end."""
    res = simulate(plan.sim_input())
    pp = plan.experiment.workload.parallel.pp
    out = []
    for r in range(pp):
        mine = [sp for sp in res.spans if sp.rank == r]
        first = min(sp.t0 for sp in mine if sp.kind == "ALLREDUCE_STEP")
        out.append(max(sp.t1 for sp in mine if sp.kind == "ALLREDUCE_WAIT") - first)
    return out


def test_a_boundary_inside_a_host_is_the_same_host_path(tmp_path):
    plans = _plans(tmp_path)
    one, two = plans[1], plans[2]
    assert [(s.dc, s.host_index, s.local_rank) for s in two.slots] == [
        ("a", 0, 0), ("a", 0, 1), ("b", 0, 0), ("b", 0, 1)]
    s0, s1, s2, _ = two.slots
    assert two.paths.path(s0, s1) == SAME_HOST and two.paths.path(s1, s0) == SAME_HOST
    # across the DC boundary both host links and the inter-DC link are still on the path
    cross = two.paths.path(s1, s2)
    assert cross.delay_s == pytest.approx(0.005 + 0.010 + 0.005)
    assert len(cross.hops) == 3
    # with one rank per host, stages 0 and 1 are on two hosts of DC a: both host links
    inside = one.paths.path(one.slots[0], one.slots[1])
    assert inside.delay_s == pytest.approx(0.010) and len(inside.hops) == 2


def test_prediction_knows_transfers_inside_a_host_are_not_shaped(tmp_path):
    plans = _plans(tmp_path)
    t1 = plans[1].prediction["predicted_iteration_time_s"]
    t2 = plans[2].prediction["predicted_iteration_time_s"]
    # two of the three boundaries lose 10 ms of delay each way and the 100 Mbit/s host links
    # (a 128 KiB activation: 10.9 ms each); the 1f1b warm-up and cool-down cross every
    # boundary, so at least 2 × 2 × 10 ms must go
    assert t2 < t1 - 0.040, (t1, t2)


def test_allreduce_between_replicas_of_one_host_is_not_shaped(tmp_path):
    # pp=2, dp=2: each DC holds one stage's two replicas, on one host with ranks_per_host=2,
    # so their ring all-reduce never crosses a host link
    plans = _plans(tmp_path, pp=2, dp=2)
    two = plans[2]
    assert [(s.pp_rank, s.dp_rank, s.dc, s.host_index) for s in two.slots] == [
        (0, 0, "a", 0), (1, 0, "b", 0), (0, 1, "a", 0), (1, 1, "b", 0)]
    one_ar, two_ar = _allreduce_s(plans[1]), _allreduce_s(two)
    # two steps over two host links (5 ms + 5 ms, 100 Mbit/s) against two same-host steps
    assert all(b < a - 2 * 0.010 for a, b in zip(one_ar, two_ar)), (one_ar, two_ar)
