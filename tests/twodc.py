"""The smallest emulated network the shaping tests use: two DCs of one host each."""
from __future__ import annotations

from testbed.topology import LinkProfile, Topology


def two_dc(**inter_dc) -> Topology:
    """DCs ``dca`` and ``dcb`` with one host each, joined by ``inter_dc`` (LinkProfile fields)."""
    return Topology(name="t", dcs=[{"name": "dca", "hosts": 1}, {"name": "dcb", "hosts": 1}],
                    inter_dc=LinkProfile(**inter_dc))


def ends(net):
    """Host 0 of each DC: the traffic between them crosses the inter-DC link."""
    return net.host("dca", 0), net.host("dcb", 0)


def two_dc_stepping(delay_ms: float, at_s: float, to_delay_ms: float) -> Topology:
    """Two DCs whose link starts at ``delay_ms`` and steps to ``to_delay_ms`` at ``at_s``."""
    return Topology(name="t", dcs=[{"name": "dca", "hosts": 1}, {"name": "dcb", "hosts": 1}],
                    links=[{"dcs": ["dca", "dcb"], "delay_ms": delay_ms,
                            "steps": [{"at_s": at_s, "delay_ms": to_delay_ms}]}])
