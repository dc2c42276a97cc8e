"""Blocking on small hand-written networks: exact counts, and Erlang B on one link."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from testbed.__main__ import main
from testbed.optical.blocking import run_blocking
from testbed.optical.load import load_blocking
from testbed.optical.network import FiberLink, OpticalNetwork
from testbed.optical.spec import BackgroundSpec, BlockingRun, NetworkSpec

HERE = Path(__file__).parent


def test_three_node_line_with_four_slots_blocks_two_of_six(capsys):
    run, net = load_blocking(HERE / "line3.yaml")
    res = run_blocking(run, net, HERE)
    assert res.outcomes == [False, False, True, True, False, False]
    assert main(["optical", "blocking", str(HERE / "line3.yaml")]) == 0
    assert "offered 6, blocked 2, blocking probability 0.333333" in capsys.readouterr().out


def _erlang_b(servers: int, erlangs: float) -> float:
    b = 1.0
    for n in range(1, servers + 1):
        b = erlangs * b / (n + erlangs * b)
    return b


def test_one_slot_requests_on_one_link_block_as_erlang_b():
    """Two nodes, 10 slots, no guard band: each direction is an M/M/10/10 loss system
    offered half the load."""
    net = NetworkSpec(nodes=["a", "b"], links=[FiberLink(a="a", b="b", km=10)], slots=10,
                      guard_slots=0)
    run = BlockingRun(network=net, poisson=BackgroundSpec(load=16, slots=(1, 1), hold_s=1.0),
                      count=40_000, seed=3)
    built = OpticalNetwork(nodes=["a", "b"], links=net.links, slots=10, guard_slots=0)
    res = run_blocking(run, built, HERE)
    assert res.probability == pytest.approx(_erlang_b(10, 8.0), abs=0.01)
    assert math.isclose(_erlang_b(10, 8.0), 0.1217, abs_tol=5e-4)


def test_shortest_only_routing_blocks_where_k_shortest_finds_another_way():
    """A triangle: a→b direct is full, a→c→b is free."""
    net = OpticalNetwork(nodes=["a", "b", "c"], slots=2, guard_slots=0, links=[
        FiberLink(a="a", b="b", km=10), FiberLink(a="a", b="c", km=10),
        FiberLink(a="c", b="b", km=10)])
    requests = [{"t": 0, "src": "a", "dst": "b", "slots": 2, "hold_s": 5},
                {"t": 1, "src": "a", "dst": "b", "slots": 2, "hold_s": 5}]
    spec = NetworkSpec(nodes=net.nodes, links=net.links, slots=2, guard_slots=0)
    blocked = {p: run_blocking(BlockingRun(network=spec, policy=p, requests=requests), net,
                               HERE).blocked for p in ("ksp_ff", "sd_ff")}
    assert blocked == {"ksp_ff": 0, "sd_ff": 1}


def test_cross_domain_routing_prefers_the_route_that_stays_in_its_domain():
    """a and b are in domain west; the shorter route between them crosses east's node e (two
    borders), the longer one stays in west."""
    net = OpticalNetwork(nodes=["a", "b", "e", "w"], slots=4, guard_slots=0,
                         domains={"west": ["a", "b", "w"], "east": ["e"]},
                         links=[FiberLink(a="a", b="e", km=10), FiberLink(a="e", b="b", km=10),
                                FiberLink(a="a", b="w", km=50), FiberLink(a="w", b="b", km=50)])
    spec = NetworkSpec(nodes=net.nodes, links=net.links, slots=4, guard_slots=0,
                       domains=net.domains)
    requests = [{"t": 0, "src": "a", "dst": "b", "slots": 1, "hold_s": 5}]
    from testbed.optical.policy import CrossDomain, Policy, SlotBounds
    from testbed.optical.routes import Router
    routes = list(Router(net).routes("a", "b"))
    assert [r.nodes for r in CrossDomain(net, SlotBounds()).order(routes)] == [
        ("a", "w", "b"), ("a", "e", "b")]
    assert [r.nodes for r in Policy(net, SlotBounds()).order(routes)][0] == ("a", "e", "b")
    assert run_blocking(BlockingRun(network=spec, policy="cross_domain", requests=requests),
                        net, HERE).blocked == 0


@pytest.mark.parametrize("change, expected", [
    (("src: a, dst: c, slots: 1, hold_s: 10}   # slots 0-1",
      "src: a, dst: q, slots: 1, hold_s: 10}   # slots 0-1"), "b.yaml:8:20 requests[0].dst: unknown node 'q'"),
    (("slots: 3, hold_s: 10", "slots: 4, hold_s: 10"), "requests[4].slots: wider than the grid"),
    (("hold_s: 1}", "hold_s: 0}"), "requests[5].hold_s: input should be greater than 0"),
    (("requests:", "poisson: {load: 5}\nrequests:"), "give requests or poisson, one of them"),
])
def test_a_bad_blocking_file_exits_2_saying_where(tmp_path, capsys, change, expected):
    text = (HERE / "line3.yaml").read_text(encoding="utf-8")
    assert change[0] in text
    (tmp_path / "b.yaml").write_text(text.replace(*change), encoding="utf-8")
    assert main(["optical", "blocking", str(tmp_path / "b.yaml")]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
