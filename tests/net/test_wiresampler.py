"""testbed/net/wiresampler.py on a real network: the bytes a router interface sends, sampled
from inside its namespace while the controller stays in its own, attributed to time windows."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from testbed.net import ledger as ledgers
from testbed.net.backends.netns import NetnsBackend
from testbed.net.ledger import Ledger, new_tag
from testbed.net.shaping.namespace import Direction
from testbed.net.shaping.shapers import DelayLineShaper
from testbed.net.wiresampler import WireSampler, tx_bytes
from testbed.spec import load_topology

pytestmark = pytest.mark.root
TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"

PROC_NET_DEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:    1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0
to-dc2: 52000      40    0    0    0     0          0         0   987654     700    0    0    0     0       0          0
"""


def test_tx_bytes_reads_the_transmit_column():
    assert tx_bytes(PROC_NET_DEV, {"to-dc2"}) == {"to-dc2": 987654}
    assert tx_bytes(PROC_NET_DEV, {"eth9"}) == {}


def test_samples_each_directions_bytes_and_splits_them_by_time(tmp_path):
    topo = load_topology(TOPOLOGIES / "two-dc.yaml")
    net = NetnsBackend().build(topo, topo.resolved_links(), Ledger(new_tag()))
    own = os.readlink("/proc/self/ns/net")
    try:
        shaper = DelayLineShaper(net, tmp_path)  # not applied: its directions, unshaped
        shaper.directions = [Direction(end, None) for end in net.link_ends]
        sources = shaper.counter_namespaces()
        assert sorted(sources) == ["dc1->dc2", "dc2->dc1"]
        a, b = net.host("dc1", 0), net.host("dc2", 0)
        with WireSampler(sources, period_s=0.005) as wire:
            time.sleep(0.2)
            t0 = time.monotonic_ns()
            net.run(a, ["ping", "-c", "5", "-i", "0.05", "-s", "20000", str(b.ip)])
            t1 = time.monotonic_ns()
            time.sleep(0.2)
            assert os.readlink("/proc/self/ns/net") == own  # the sampler's thread entered alone
        assert wire.sampled() and len(wire.times) > 50
        # the quiet window ends at the last sample taken before t0: a sampling period that
        # straddles t0 (long when the machine is busy) may hold the first request's bytes, and
        # its interpolation would move part of them before t0 (CI once counted 3527 bytes so)
        quiet = wire.between(wire.times[0], max(t for t in wire.times if t <= t0))
        busy = wire.between(t0, t1)
        # five 20 kB echo requests one way, five replies the other (IP fragments, headers);
        # the bytes of a sampling period that a window's edge cuts are interpolated, so the
        # first request may count partly before t0
        for key in ("dc1->dc2", "dc2->dc1"):
            assert 4 * 20000 <= busy[key] <= 5 * 21000, busy
        assert quiet["dc1->dc2"] < 2000, quiet
        whole = wire.between(wire.times[0], wire.times[-1])
        assert whole["dc1->dc2"] == wire.sent["dc1->dc2"][-1] - wire.sent["dc1->dc2"][0]
    finally:
        net.teardown()
    assert [n for n in ledgers.tagged_namespaces() if n.startswith(net.tag)] == []


def test_routers_elsewhere_give_no_samples():
    with WireSampler({"dc1->dc2": ("/run/netns/no-such-namespace", "to-dc2")}) as wire:
        time.sleep(0.05)
    assert not wire.sampled() and wire.between(0, 10**18) == {}
