"""In-order placement: contiguous stage blocks per DC, replicas on the next free hosts."""
import pytest

from testbed.errors import SpecError
from testbed.topology import Topology
from testbed.plan.placement import in_order, stage_dcs


def _topo(*hosts: int) -> Topology:
    return Topology(name="t", dcs=[{"name": f"dc{i + 1}", "hosts": h} for i, h in enumerate(hosts)])


def test_four_stages_over_two_dcs_cross_the_boundary_once():
    assert stage_dcs(_topo(4, 4), 4) == ["dc1", "dc1", "dc2", "dc2"]


def test_more_dcs_than_stages_uses_the_first_dcs():
    assert stage_dcs(_topo(1, 1, 1), 2) == ["dc1", "dc2"]


def test_dp_replicas_take_distinct_hosts():
    slots = in_order(_topo(4, 4), pp=4, dp=2)
    assert [(s.rank, s.dc, s.host_index) for s in slots] == [
        (0, "dc1", 0), (1, "dc1", 1), (2, "dc2", 0), (3, "dc2", 1),
        (4, "dc1", 2), (5, "dc1", 3), (6, "dc2", 2), (7, "dc2", 3)]


def test_rejects_a_dc_without_enough_hosts():
    with pytest.raises(SpecError, match="puts 2 ranks in DC dc2, which holds 1 "):
        in_order(_topo(4, 1), pp=4, dp=1)


# ---------------------------------------------------------------- link-aware placements

import itertools  # noqa: E402

from testbed.plan.placement import (LinkCost, PlacementProblem, atlas, capacity_problem,  # noqa: E402
                               cba, cba_candidates)

MB = 1_000_000


def _problem(topo: Topology, links: dict[frozenset, tuple[float, float]], pp: int, dp: int = 1,
             m: int = 8, evaluate=None) -> PlacementProblem:
    """Costs by DC pair: (one-way delay s, rate bit/s); inside a DC: no delay, 10 Gbit/s."""
    def cost(a: str, b: str) -> LinkCost:
        d, r = links.get(frozenset((a, b)), (0.0, 10e9))
        return LinkCost(d, r)
    return PlacementProblem(topo, pp, dp, m, 0.02, 0.04, MB, cost,
                            lambda n, c: n * 8 / c.rate_bps, evaluate)


THIN, BACKBONE = (0.010, 100e6), (0.015, 1000e6)
UNEQUAL = {frozenset(("dc1", "dc2")): THIN, frozenset(("dc2", "dc3")): THIN,
           frozenset(("dc1", "dc3")): BACKBONE}


def test_cba_ilp_finds_the_linear_models_optimum():
    # brute force over every stage → DC assignment that fits the hosts
    topo = _topo(3, 3, 2)
    prob = _problem(topo, UNEQUAL, pp=7)
    names = ["dc1", "dc2", "dc3"]
    fits = [list(a) for a in itertools.product(names, repeat=7)
            if all(a.count(n) <= topo.dc(n).hosts for n in names)]
    best = min(prob.linear_time_s(a) for a in fits)
    cands = cba_candidates(prob, k=3)
    assert prob.linear_time_s(cands[0]) == pytest.approx(best)
    assert len({tuple(c) for c in cands}) == 3  # the no-good cuts give distinct assignments
    assert [prob.linear_time_s(c) for c in cands] == sorted(prob.linear_time_s(c) for c in cands)


def test_cba_avoids_the_thin_links_when_two_dcs_hold_the_pipeline():
    slots = cba(_problem(_topo(3, 3, 3), UNEQUAL, pp=6))
    assert sorted({s.dc for s in slots}) == ["dc1", "dc3"]
    assert sum(a.dc != b.dc for a, b in zip(slots, slots[1:])) == 1  # one boundary crossing


def test_cba_takes_the_simulators_choice_among_ilp_candidates():
    prob = _problem(_topo(3, 3, 3), UNEQUAL, pp=6)
    first = cba_candidates(prob)[0]
    # an evaluator that dislikes the ILP's favourite: the next candidate wins
    prob.evaluate = lambda slots: 9.0 if [s.dc for s in slots] == first else 1.0
    assert [s.dc for s in cba(prob)] != first


def test_atlas_uses_the_fewest_dcs_and_the_cheapest_chain():
    slots = atlas(_problem(_topo(3, 3, 3), UNEQUAL, pp=6))
    assert [s.dc for s in slots] in (["dc1"] * 3 + ["dc3"] * 3, ["dc3"] * 3 + ["dc1"] * 3)
    # all three needed: the thin DC goes to an end of the chain, crossing one thin link
    dcs = [s.dc for s in atlas(_problem(_topo(3, 3, 3), UNEQUAL, pp=8))]
    assert dcs[0] == "dc2" or dcs[-1] == "dc2"
    assert len(set(dcs)) == 3


def test_link_aware_placements_keep_replicas_in_one_dc():
    for place in (atlas, cba):
        slots = place(_problem(_topo(4, 4, 2), UNEQUAL, pp=4, dp=2))
        for s in range(4):
            assert len({x.dc for x in slots if x.pp_rank == s}) == 1
        assert len({(x.dc, x.host_index) for x in slots}) == 8


def test_capacity_problem_names_the_shortfall():
    assert capacity_problem(_topo(3, 3), 4, 2, "cba") == (
        "cba keeps a stage's 2 replica(s) in one DC: the DCs hold 2 such stages "
        "(ranks_per_host=1), the pipeline has pp=4")
    assert capacity_problem(_topo(4, 4), 4, 2, "atlas") is None
    assert "which holds 1 (1 hosts × ranks_per_host=1)" in capacity_problem(_topo(4, 1), 4, 1,
                                                                      "in_order")


def test_in_order_never_builds_link_costs():
    from testbed.plan.placement import place

    def no_costs():
        raise AssertionError("in_order asked for link costs")
    slots = place("in_order", _topo(2, 2), 4, 1, no_costs)
    assert [s.dc for s in slots] == ["dc1", "dc1", "dc2", "dc2"]
    with pytest.raises(ValueError, match="valid: in_order, atlas, cba"):
        place("random", _topo(2, 2), 4, 1, no_costs)


# ---------------------------------------------------------------- several ranks per host

import json  # noqa: E402

from testbed.cell.cellfile import CellFile  # noqa: E402
from testbed.spec import Workload  # noqa: E402


def _hosts(slots) -> list[tuple[int, str, int, int]]:
    return [(s.rank, s.dc, s.host_index, s.local_rank) for s in slots]


def test_ranks_per_host_fills_a_host_before_the_next():
    # pp=4 on two DCs of one host each: the DC boundary is between the hosts, stages 0|1 and
    # 2|3 share a host
    assert _hosts(in_order(_topo(1, 1), pp=4, dp=1, ranks_per_host=2)) == [
        (0, "dc1", 0, 0), (1, "dc1", 0, 1), (2, "dc2", 0, 0), (3, "dc2", 0, 1)]
    # a DC's k-th rank (replicas after the first pipeline) runs on host k // 2, local k % 2
    assert _hosts(in_order(_topo(2, 2), pp=4, dp=2, ranks_per_host=2)) == [
        (0, "dc1", 0, 0), (1, "dc1", 0, 1), (2, "dc2", 0, 0), (3, "dc2", 0, 1),
        (4, "dc1", 1, 0), (5, "dc1", 1, 1), (6, "dc2", 1, 0), (7, "dc2", 1, 1)]
    # a host that is not filled: the last host holds fewer
    assert _hosts(in_order(_topo(2), pp=4, dp=1, ranks_per_host=3)) == [
        (0, "dc1", 0, 0), (1, "dc1", 0, 1), (2, "dc1", 0, 2), (3, "dc1", 1, 0)]


def test_capacity_counts_ranks_not_hosts():
    assert capacity_problem(_topo(1, 1), 4, 1, "in_order", ranks_per_host=2) is None
    assert capacity_problem(_topo(1, 1), 4, 1, "in_order") == (
        "in_order puts 2 ranks in DC dc1, which holds 1 (1 hosts × ranks_per_host=1)")
    assert capacity_problem(_topo(1, 1), 4, 2, "in_order", ranks_per_host=2) == (
        "in_order puts 4 ranks in DC dc1, which holds 2 (1 hosts × ranks_per_host=2)")
    assert capacity_problem(_topo(2, 2), 4, 2, "cba", ranks_per_host=2) is None
    assert capacity_problem(_topo(2, 2), 4, 2, "cba") is not None
    assert capacity_problem(_topo(2, 1), 6, 2, "atlas", ranks_per_host=2) == (
        "atlas keeps a stage's 2 replica(s) in one DC: the DCs hold 3 such stages "
        "(ranks_per_host=2), the pipeline has pp=6")


def test_link_aware_placements_keep_a_hosts_ranks_in_one_dc():
    for place in (atlas, cba):
        prob = _problem(_topo(2, 2, 1), UNEQUAL, pp=4, dp=2)
        prob.ranks_per_host = 2
        slots = place(prob)
        hosts = {}
        for s in slots:
            hosts.setdefault((s.dc, s.host_index), []).append(s.local_rank)
        assert len(slots) == 8 and all(sorted(v) == list(range(len(v))) for v in hosts.values())
        assert max(len(v) for v in hosts.values()) == 2 and len(hosts) == 4
        for s in range(4):
            assert len({x.dc for x in slots if x.pp_rank == s}) == 1


def test_cell_files_without_local_rank_still_read(tmp_path):
    # cell.json written before ranks_per_host existed: every slot is local rank 0
    old = CellFile(cell_id="c1", workload=Workload(), placement=in_order(_topo(2, 2), 4, 1))
    data = old.model_dump(mode="json")
    for slot in data["placement"]:
        del slot["local_rank"]
    path = tmp_path / "cell.json"
    path.write_text(json.dumps(data))
    assert [s.local_rank for s in CellFile.read(path).placement] == [0, 0, 0, 0]
