"""In-order placement: contiguous stage blocks per DC, replicas on the next free hosts."""
import pytest

from testbed.errors import SpecError
from testbed.net.topology import Topology
from testbed.placement import in_order, stage_dcs


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
    with pytest.raises(SpecError, match="puts 2 ranks in DC dc2, which has 1 hosts"):
        in_order(_topo(4, 1), pp=4, dp=1)
