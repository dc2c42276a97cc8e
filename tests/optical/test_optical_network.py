"""The optical network: NSFNET as shipped, routes, checks of hand-written networks, and the
docs naming every field of the optical files."""
from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from testbed.optical.network import FiberLink, OpticalNetwork
from testbed.optical.nsfnet import nsfnet
from testbed.optical.routes import Router
from testbed.optical.schema import optical_schema

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_nsfnet_has_14_nodes_and_21_links_of_the_tabulated_lengths():
    net = nsfnet()
    assert len(net.nodes) == 14 and len(net.links) == 21
    assert sum(lk.km for lk in net.links) == 39_900
    assert (net.slots, net.slot_ghz, net.gbps_per_slot, net.guard_slots) == (80, 12.5, 75, 1)


def test_k_shortest_routes_are_distinct_loop_free_and_in_length_order():
    router = Router(nsfnet(), k=4)
    for src, dst in (("n1", "n14"), ("n3", "n10"), ("n7", "n12")):
        routes = router.routes(src, dst)
        assert len(routes) == 4 and len({r.nodes for r in routes}) == 4
        assert [r.km for r in routes] == sorted(r.km for r in routes)
        for r in routes:
            assert len(set(r.nodes)) == len(r.nodes) and r.nodes[0] == src and r.nodes[-1] == dst
    assert router.routes("n1", "n14")[0].km == 7200   # n1-n8-n9-n13-n14


def test_a_line_has_one_route_per_direction():
    net = OpticalNetwork(nodes=["a", "b", "c"], links=[FiberLink(a="a", b="b", km=1),
                                                        FiberLink(a="b", b="c", km=1)])
    there, back = Router(net).routes("a", "c"), Router(net).routes("c", "a")
    assert len(there) == len(back) == 1
    assert set(there[0].fibers).isdisjoint(back[0].fibers)


@pytest.mark.parametrize("change, message", [
    ({"links": [{"a": "a", "b": "z", "km": 1}]}, "unknown node 'z'"),
    ({"links": [{"a": "a", "b": "b", "km": 1}, {"a": "b", "b": "a", "km": 2}]}, "listed twice"),
    ({"links": [{"a": "a", "b": "a", "km": 1}]}, "two different nodes"),
    ({"dcs": {"x": "q"}}, "dcs.x: unknown node 'q'"),
    ({"nodes": ["a", "a", "b"]}, "node names repeat"),
    ({"domains": {"w": ["a"], "e": ["a"]}}, "two domains"),
])
def test_hand_written_networks_are_checked(change, message):
    base = {"nodes": ["a", "b"], "links": [{"a": "a", "b": "b", "km": 1}]}
    with pytest.raises(ValidationError, match=message):
        OpticalNetwork.model_validate({**base, **change})


def _fields(schema: dict, node: dict, prefix: str = "") -> set[str]:
    out = set()
    for name, spec in node.get("properties", {}).items():
        out.add(prefix + name)
        ref = spec.get("$ref") or next((m.get("$ref") for m in spec.get("anyOf", [])
                                        if m.get("$ref")), None)
        if ref:
            out |= _fields(schema, schema["$defs"][ref.rsplit("/", 1)[-1]], f"{prefix}{name}.")
    return out


def test_the_docs_name_every_field_of_the_optical_experiment_file():
    page = (DOCS / "optical.md").read_text(encoding="utf-8")
    schema = optical_schema("experiment")
    missing = sorted(f for f in _fields(schema, schema) if f"`{f}" not in page
                     and f.split(".")[-1] not in ("links", "nodes", "use"))
    assert not missing, missing
