"""The tc argv the remote shaper sends and how it reads them back (no root, no SSH)."""
from __future__ import annotations

import ipaddress

from testbed.net.lab.network import align_trace
from testbed.topology import LinkProfile
from testbed.net.lab.nic import Route, check, host_argvs, parse_u32

DC2 = [ipaddress.ip_network("10.2.0.0/24")]
DC3 = [ipaddress.ip_network("10.3.0.0/24"), ipaddress.ip_network("10.30.0.0/16")]

U32_SHOW = """\
filter parent 1: protocol ip pref 1 u32 chain 0
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 flowid 1:11 not_in_hw
  match 0a020000/ffffff00 at 16
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800::801 order 2049 key ht 800 bkt 0 flowid 1:12 not_in_hw
  match 0a030000/ffffff00 at 16
"""


def test_rate_only_destinations_get_an_htb_class_a_bfifo_leaf_and_a_filter():
    p = LinkProfile(rate_mbit=1000)
    argvs = host_argvs("eth0", [Route("dc2", "11", DC2, p)])
    assert argvs[0] == ["tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb",
                        "default", "0"]
    assert argvs[1][:9] == ["tc", "class", "add", "dev", "eth0", "parent", "1:", "classid",
                            "1:11"]
    assert argvs[1][9:14] == ["htb", "rate", "1000mbit", "ceil", "1000mbit"]
    assert argvs[2] == ["tc", "qdisc", "add", "dev", "eth0", "parent", "1:11", "handle", "1100:",
                        "bfifo", "limit", str(p.queue_limit_bytes())]
    assert argvs[3] == ["tc", "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip",
                        "prio", "1", "u32", "match", "ip", "dst", "10.2.0.0/24", "flowid", "1:11"]
    assert len(argvs) == 4


def test_delay_uses_netem_then_tbf_and_one_filter_per_destination_subnet():
    p = LinkProfile(delay_ms=25, jitter_ms=1, loss_pct=0.5, rate_mbit=100)
    argvs = host_argvs("ens1f0", [Route("dc3", "12", DC3, p)])
    netem = argvs[2]
    assert netem[:10] == ["tc", "qdisc", "add", "dev", "ens1f0", "parent", "1:12", "handle",
                          "1200:", "netem"]
    assert netem[10:] == ["delay", "25ms", "1ms", "distribution", "normal", "loss", "random",
                          "0.5%", "limit", netem[-1]]
    assert argvs[3][5:10] == ["parent", "1200:1", "handle", "1201:", "tbf"]
    assert [a[15] for a in argvs[4:]] == ["10.3.0.0/24", "10.30.0.0/16"]


def test_unshaped_destinations_and_hosts_get_nothing():
    assert host_argvs("eth0", [Route("dc2", "11", DC2, LinkProfile())]) == []


def test_reads_u32_filters_back_as_flow_and_subnet():
    assert parse_u32(U32_SHOW) == {("1:11", "10.2.0.0/24"), ("1:12", "10.3.0.0/24")}


def test_read_back_names_a_wrong_rate_and_a_missing_filter():
    p = LinkProfile(rate_mbit=1000)
    qdiscs = [{"kind": "htb", "handle": "1:", "root": True},
              {"kind": "bfifo", "handle": "1100:", "options": {"limit": p.queue_limit_bytes()}}]
    classes = [{"kind": "htb", "handle": "1:11", "rate": 100e6 / 8}]
    bad = check([Route("dc2", "11", DC2, p)], qdiscs, classes, set())
    assert [m.what for m in bad] == ["to dc2: htb rate (Mbit/s)", "to dc2: filter"]
    classes[0]["rate"] = 1000e6 / 8
    assert check([Route("dc2", "11", DC2, p)], qdiscs, classes,
                 {("1:11", "10.2.0.0/24")}) == []


def test_traces_are_moved_onto_the_controller_clock():
    text = ('{"type": "meta", "rank": 1}\n{"type": "action", "t0": 1000, "t1": 3000}\n'
            '{"type": "end", "t": 5000}\n{"type": "act')
    out = align_trace(text, offset_ns=400, uncertainty_ns=50).splitlines()
    assert '"clock_offset_ns": 400' in out[0] and '"t0": 600, "t1": 2600' in out[1]
    assert '"t": 4600' in out[2] and out[3] == '{"type": "act'
