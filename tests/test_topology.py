"""The topology model (pure data): merging, distance → delay, routes, queue sizing, bad input."""
from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from testbed.topology import LinkProfile, Topology
from testbed.spec import load_topology

ROOT = Path(__file__).resolve().parents[1] / "topologies"


def test_distance_becomes_five_microseconds_per_km():
    links = {lk.name: lk for lk in load_topology(ROOT / "three-dc.yaml").resolved_links()}
    assert links["dc1-dc2"].a_to_b.one_way_delay_ms == pytest.approx(2.0)
    assert links["dc1-dc3"].a_to_b.one_way_delay_ms == pytest.approx(10.0)


def test_preset_fills_only_unset_fields():
    p = LinkProfile(preset="wan", rate_mbit=300).merged(None)
    assert (p.rate_mbit, p.jitter_ms, p.loss_pct) == (300, 1.0, 0.01)


def test_override_delay_replaces_distance():
    p = LinkProfile(distance_km=1000).merged(LinkProfile(delay_ms=3))
    assert p.one_way_delay_ms == 3 and p.distance_km is None


def test_reverse_overrides_one_direction_only():
    t = Topology(name="t", dcs=[{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
                 links=[{"dcs": ["a", "b"], "delay_ms": 5, "reverse": {"delay_ms": 9}}])
    (lk,) = t.resolved_links()
    assert (lk.a_to_b.delay_ms, lk.b_to_a.delay_ms) == (5, 9)


def test_ring_routes_opposite_dcs_through_a_neighbour():
    routes = load_topology(ROOT / "four-dc-ring.yaml").routes()
    assert routes["dc1"]["dc3"] in {"dc2", "dc4"}
    assert routes["dc1"]["dc2"] == "dc2"


def test_default_queue_is_one_bdp_with_a_floor():
    assert LinkProfile(rate_mbit=1000, delay_ms=10).queue_limit_bytes() == 2_500_000
    assert LinkProfile(rate_mbit=10, delay_ms=1).queue_limit_bytes() == 256 * 1024
    assert LinkProfile(delay_ms=1).queue_limit_bytes() is None


@pytest.mark.parametrize("bad", [
    {"delay_ms": -1}, {"loss_pct": 100.5}, {"rate_mbit": 0}, {"jitter_ms": -0.1},
])
def test_rejects_out_of_range_profile(bad):
    with pytest.raises(ValidationError):
        LinkProfile(**bad)


def test_rejects_disconnected_dcs():
    with pytest.raises(ValidationError, match="not connected"):
        Topology(name="t", dcs=[{"name": n, "hosts": 1} for n in "abc"],
                 links=[{"dcs": ["a", "b"]}])


def test_link_trace_csv_becomes_steps(tmp_path):
    from testbed.spec import load_topology as load

    (tmp_path / "t.csv").write_text("at_s,delay_ms,rate_mbit\n2,,300\n0.5,20,\n")
    (tmp_path / "topo.yaml").write_text(
        "name: t\ndcs: [{name: a, hosts: 1}, {name: b, hosts: 1}]\n"
        "links: [{dcs: [a, b], delay_ms: 5, trace_csv: t.csv}]\n")
    (lk,) = load(tmp_path / "topo.yaml").resolved_links()
    assert [(s.at_s, s.delay_ms, s.rate_mbit) for s in lk.steps] == [(0.5, 20, None),
                                                                     (2, None, 300)]


def test_bad_trace_row_is_reported_at_the_trace_field(tmp_path):
    from testbed.errors import SpecError
    from testbed.spec import load_topology as load

    (tmp_path / "t.csv").write_text("at_s,delay_ms\n1,-4\n")
    (tmp_path / "topo.yaml").write_text(
        "name: t\ndcs: [{name: a, hosts: 1}, {name: b, hosts: 1}]\n"
        "links: [{dcs: [a, b], trace_csv: t.csv}]\n")
    with pytest.raises(SpecError, match=r"trace_csv: trace t.csv: row 2, delay_ms"):
        load(tmp_path / "topo.yaml")
