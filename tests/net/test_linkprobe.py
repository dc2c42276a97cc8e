"""testbed/net/linkprobe.py against a real iperf3 on a real netns network."""
from __future__ import annotations

from pathlib import Path

import pytest

from testbed.net import ledger as ledgers
from testbed.net.backends.netns import NetnsBackend
from testbed.net.ledger import Ledger, new_tag
from testbed.net.linkprobe import omit_s, throughput
from testbed.spec import load_topology

pytestmark = pytest.mark.root
TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"


def test_the_probe_waits_for_an_iperf3_server_that_listens_late():
    # on a busy machine the server's `ip netns exec` can take longer than the client's first
    # try; iperf3 -J then exits 0 with a "Connection refused" error in its JSON, and the probe
    # must try again rather than fail the cell
    topo = load_topology(TOPOLOGIES / "two-dc-unshaped.yaml")
    net = NetnsBackend().build(topo, topo.resolved_links(), Ledger(new_tag()))
    try:
        started = net.popen

        def late(node, argv, **kw):
            return started(node, ["sh", "-c", "sleep 0.6; exec " + " ".join(argv)], **kw)

        net.popen = late
        a, b = net.host(topo.dcs[0].name, 0), net.host(topo.dcs[1].name, 0)
        assert throughput(net, a, b, seconds=1, omit=0) > 10
    finally:
        net.teardown()
    assert [n for n in ledgers.tagged_namespaces() if n.startswith(net.tag)] == []


def test_omission_is_whole_seconds_iperf3_can_read():
    # iperf3 parses -O as an integer: "-O 0.5" omitted nothing
    assert [omit_s(rtt) for rtt in (0.1, 20, 40, 41, 80, 300)] == [1, 1, 1, 2, 2, 2]


def test_a_fraction_of_a_second_is_refused_before_iperf3_runs():
    with pytest.raises(ValueError, match="whole seconds"):
        throughput(None, None, None, seconds=1, omit=0.5)
