"""Placements with a stage's replicas in different DCs: ``dp_across_dcs`` (whole pipelines
inside DCs) and an explicit ``placement: {map: …}``; their capacity checks at validate time
(exit 2, file:line:col) and the all-reduce steps they lead to (testbed/spec/allreduce.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from testbed.errors import SpecError
from testbed.plan import plan_all
from testbed.plan.grid import dp_across_dcs, slots_of
from testbed.spec import load_experiment
from testbed.spec.allreduce import bucket_sizes, rank_steps
from testbed.topology import Topology

ROOT = Path(__file__).resolve().parents[1]


def _topo(*hosts: int) -> Topology:
    return Topology(name="t", dcs=[{"name": f"dc{i + 1}", "hosts": h} for i, h in enumerate(hosts)])


def test_dp_across_dcs_keeps_each_pipeline_in_one_dc_round_robin():
    assert dp_across_dcs(_topo(2, 2, 2), pp=2, dp=3) == [["dc1"] * 2, ["dc2"] * 2, ["dc3"] * 2]
    # dp = 4 over two DCs: replicas alternate, skipping a DC that is full
    assert dp_across_dcs(_topo(4, 4), pp=2, dp=4) == [["dc1"] * 2, ["dc2"] * 2] * 2
    assert dp_across_dcs(_topo(6, 2), pp=2, dp=4) == [["dc1"] * 2, ["dc2"] * 2, ["dc1"] * 2,
                                                       ["dc1"] * 2]
    with pytest.raises(SpecError, match="hold 2 such pipelines .* dp=3"):
        dp_across_dcs(_topo(3, 2), pp=2, dp=3)


def test_slots_of_a_grid_fill_hosts_in_rank_order():
    slots = slots_of(_topo(2, 2), [["dc1", "dc2"], ["dc2", "dc1"]], "map")
    assert [(s.rank, s.pp_rank, s.dp_rank, s.dc, s.host_index) for s in slots] == [
        (0, 0, 0, "dc1", 0), (1, 1, 0, "dc2", 0), (2, 0, 1, "dc2", 1), (3, 1, 1, "dc1", 1)]


EXP = """\
name: dpx
topology:
  name: dpx
  dcs: [{name: east, hosts: 2}, {name: west, hosts: 1}]
  inter_dc: {delay_ms: 10, rate_mbit: 100}
workload:
  model: {layers: 4, hidden: 64, heads: 4, seq_len: 32, vocab: 128}
  parallel: {pp: 1, dp: 3}
  gradient_sync: {algorithm: %s}
placement:
  map:
    - [east]
    - [%s]
    - [west]
"""


def _validate(tmp_path, algorithm: str, second: str) -> subprocess.CompletedProcess:
    path = tmp_path / "exp.yaml"
    path.write_text(EXP % (algorithm, second))
    return subprocess.run([sys.executable, "-m", "testbed", "plan", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_a_map_naming_an_unknown_dc_or_overfilling_one_is_exit_2_at_its_place(tmp_path):
    res = _validate(tmp_path, "ring", "north")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "exp.yaml:13:8 placement.map[1][0]: no DC 'north'" in res.stdout + res.stderr
    res = _validate(tmp_path, "ring", "west")
    assert res.returncode == 2
    assert "exp.yaml:11:3 placement.map: placement map puts 2 ranks in DC west, which " \
           "holds 1" in res.stdout + res.stderr
    assert "Traceback" not in res.stderr


def test_hierarchical_plans_dcs_holding_unequal_numbers_of_replicas(tmp_path):
    assert _validate(tmp_path, "ring", "east").returncode == 0
    res = _validate(tmp_path, "hierarchical", "east")  # east holds 2 replicas, west 1
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_row_settings_record_the_map(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(EXP % ("ring", "east"))
    (plan,) = plan_all(load_experiment(path))
    assert plan.grid == [["east"], ["east"], ["west"]]
    assert plan.experiment.placement_name == "map"


def _all_reduce(grid, algorithm, numel, bucket=None):
    """Run every rank's steps on numbers: each rank's vector, summed as the steps say."""
    from testbed.topology import Slot
    pp = len(grid[0])
    slots = [Slot(d * pp + s, s, d, dc, 0) for d, row in enumerate(grid) for s, dc in enumerate(row)]
    ranks = [s.rank for s in slots if s.pp_rank == 0]
    steps = {r: rank_steps(slots, r, numel, algorithm, bucket) for r in ranks}
    assert len({len(v) for v in steps.values()}) == 1  # step i is the same step everywhere
    rng = np.random.default_rng(0)
    vec = {r: rng.random(numel) for r in ranks}
    sizes = bucket_sizes(numel, bucket)
    starts = np.cumsum([0] + sizes)

    def length(r, b):  # the bucket's padded vector: as far as any step reaches
        return max(max(st.send_at, st.recv_at) + st.numel for st in steps[r] if st.bucket == b)
    bufs = {r: [np.concatenate([vec[r][starts[b]:starts[b + 1]],
                                np.zeros(length(r, b) - n)]) for b, n in enumerate(sizes)]
            for r in ranks}
    for i in range(len(steps[ranks[0]])):
        live = [r for r in ranks if not steps[r][i].idle]
        sent = {(r, steps[r][i].send_to): bufs[r][steps[r][i].bucket][
            steps[r][i].send_at:steps[r][i].send_at + steps[r][i].numel].copy() for r in live}
        for r in live:
            st = steps[r][i]
            assert not steps[st.send_to][i].idle and not steps[st.recv_from][i].idle
            view = bufs[r][st.bucket][st.recv_at:st.recv_at + st.numel]
            view[:] = view + sent[(st.recv_from, r)] if st.reduce else sent[(st.recv_from, r)]
    want = sum(vec.values())
    for r in ranks:
        got = np.concatenate([bufs[r][b][:n] for b, n in enumerate(sizes)])
        assert np.allclose(got, want), (grid, algorithm, r)
    return steps[ranks[0]]


@pytest.mark.parametrize("algorithm", ["ring", "hierarchical"])
def test_the_steps_sum_every_replicas_gradients(algorithm):
    grid = [["a"], ["b"], ["c"], ["a"], ["b"], ["c"]]
    steps = _all_reduce(grid, algorithm, 1001)
    # flat: 2(6−1) steps; hierarchical: 2(2−1) inside + 2(3−1) between DCs
    assert len(steps) == (10 if algorithm == "ring" else 6)
    _all_reduce(grid, algorithm, 1001, bucket=300)  # four buckets, one after the other


@pytest.mark.parametrize("grid", [
    [["a"], ["a"], ["b"]],                                   # 2 and 1
    [["a"], ["b"], ["a"], ["c"], ["a"]],                     # 3, 1 and 1
    [["a"], ["a"], ["a"], ["b"], ["b"]],                     # 3 and 2: shards cut at 1/3, 1/2, 2/3
    [["a"], ["b"], ["a"], ["b"], ["a"], ["c"], ["c"], ["a"]],  # 4, 2 and 2
])
def test_hierarchical_over_unequal_dcs_sums_every_replica(grid):
    steps = _all_reduce(grid, "hierarchical", 1001)
    _all_reduce(grid, "hierarchical", 1001, bucket=300)
    assert any(st.idle for st in steps) or len({row[0] for row in grid}) == 2


def test_hierarchical_over_unequal_dcs_crosses_the_wan_with_shards():
    from testbed.topology import Slot
    grid = ["a", "a", "a", "b", "b"]  # the vector cut at 1/3, 1/2 and 2/3: four pieces
    slots = [Slot(d, 0, d, dc, 0) for d, dc in enumerate(grid)]
    dc = {s.rank: s.dc for s in slots}
    wan = {r: [st for st in rank_steps(slots, r, 1200, "hierarchical")
               if not st.idle and dc[st.send_to] != dc[r]] for r in range(5)}
    # each piece crosses once each way per step of its 2-DC ring (reduce-scatter, all-gather)
    assert sum(st.numel for st in wan[0] + wan[1] + wan[2]) == 1200
    assert sum(st.numel for st in wan[3] + wan[4]) == 1200
    # the flat ring sends 2 × 4/5 of the vector over each WAN direction it crosses
    flat = sum(st.numel for r in range(5) for st in rank_steps(slots, r, 1200, "ring")
               if dc[st.send_to] != dc[r])
    assert flat == 2 * 2 * 4 * 1200 // 5


def test_hierarchical_sends_a_shard_between_dcs():
    from testbed.topology import Slot
    grid = [["a"], ["b"], ["a"], ["b"]]
    slots = [Slot(d, 0, d, row[0], 0) for d, row in enumerate(grid)]
    steps = rank_steps(slots, 0, 1000, "hierarchical")
    dc = {s.rank: s.dc for s in slots}
    wan = [st for st in steps if dc[st.send_to] != dc[0]]
    # the shard of 500 elements crosses as 2 steps of 250; the flat ring sends 3 × 2 × 250
    assert [st.numel for st in wan] == [250, 250]
    flat = [st for st in rank_steps(slots, 0, 1000, "ring") if dc[st.send_to] != dc[0]]
    assert len(flat) in (0, 6)  # rank 0 sends inside its DC in the DC-ordered ring
