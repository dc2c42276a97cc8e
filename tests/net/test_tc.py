"""What the shapers send to the kernel: tc argv for netem (absent here) and htb, and read-back.

netem is not in this machine's kernel, so the netem request is tested two ways: its argv
(unit), and by handing it to the real ``tc``, which must parse and encode it and get the
*kernel's* "unknown qdisc" refusal rather than a parse error of its own.
"""
from __future__ import annotations

import subprocess

import pytest

from testbed.net.shaping import tc
from testbed.net.topology import GilbertElliott, LinkProfile
from testbed.probe import kernel_has_netem


def test_netem_carries_delay_jitter_distribution_and_loss():
    p = LinkProfile(delay_ms=12.5, jitter_ms=2, jitter_distribution="pareto", loss_pct=0.5)
    args = tc.netem_args(p)
    assert args[:5] == ["delay", "12.5ms", "2ms", "distribution", "pareto"]
    assert args[5:8] == ["loss", "random", "0.5%"]
    assert args[-2] == "limit"


def test_netem_gilbert_elliott_uses_gemodel_with_one_minus_k():
    p = LinkProfile(delay_ms=1, loss_model="gilbert_elliott",
                    gilbert_elliott=GilbertElliott(p_pct=1, r_pct=20, loss_bad_pct=50,
                                                   loss_good_pct=0.1))
    args = tc.netem_args(p)
    i = args.index("gemodel")
    assert args[i + 1:i + 5] == ["1%", "20%", "50%", "99.9%"]


def test_netem_limit_holds_the_whole_bandwidth_delay_product_twice():
    p = LinkProfile(delay_ms=50, rate_mbit=10_000)
    packets_in_flight = 10_000e6 / 8 * 0.050 / 1500
    assert tc.netem_limit(p) >= 2 * packets_in_flight
    assert tc.netem_limit(LinkProfile(delay_ms=0.1)) == tc.NETEM_MIN_LIMIT


def test_netem_with_rate_adds_tbf_child_with_queue_limit():
    p = LinkProfile(delay_ms=5, rate_mbit=100, queue={"packets": 100})
    root, child = tc.netem_argvs("to-dc2", p)
    assert root[:9] == ["tc", "qdisc", "replace", "dev", "to-dc2", "root", "handle", "1:", "netem"]
    assert child[child.index("parent") + 1] == "1:1" and "tbf" in child
    assert child[child.index("rate") + 1] == "100mbit"
    assert child[child.index("limit") + 1] == "150000"


def test_rate_layout_is_htb_class_and_bfifo_leaf():
    p = LinkProfile(delay_ms=10, rate_mbit=1000)
    qd, cls, leaf = tc.rate_argvs("to-dc2", p)
    assert qd[-3:] == ["htb", "default", "1"]
    assert cls[cls.index("rate") + 1] == "1000mbit" and cls[cls.index("ceil") + 1] == "1000mbit"
    assert leaf[-3:] == ["bfifo", "limit", str(p.queue_limit_bytes())]
    assert tc.rate_argvs("x", LinkProfile(delay_ms=3)) == []


def test_burst_fits_two_gso_packets_and_a_millisecond():
    assert tc.burst_bytes(100) == 2 * 65536
    assert tc.burst_bytes(10_000) == 1_250_000


def test_parse_classes_reads_htb_rates_in_bytes_per_second():
    text = "class htb 1:1 root leaf 10: prio 0 rate 899Mbit ceil 899Mbit burst 131000b cburst 1b\n"
    (c,) = tc.parse_classes(text)
    assert c["handle"] == "1:1" and c["rate"] == pytest.approx(899e6 / 8)


def test_check_rate_names_every_mismatch():
    p = LinkProfile(delay_ms=1, rate_mbit=100)
    qdiscs = [{"kind": "htb", "handle": "1:"}, {"kind": "bfifo", "handle": "10:",
                                                 "options": {"limit": 1}}]
    classes = [{"handle": "1:1", "rate": 50e6 / 8}]
    found = {m.what for m in tc.check_rate(p, qdiscs, classes)}
    assert found == {"queue", "htb rate (bytes/s)"}


def test_check_netem_accepts_what_tc_reports_for_the_request():
    p = LinkProfile(delay_ms=10, rate_mbit=100)
    qdiscs = [{"kind": "netem", "handle": "1:", "options": {
        "limit": tc.netem_limit(p), "delay": {"delay": 0.010, "jitter": 0}}},
        {"kind": "tbf", "handle": "10:", "options": {"rate": 12_500_000}}]
    assert tc.check_netem(p, qdiscs) == []
    qdiscs[0]["options"]["delay"]["delay"] = 0.011
    assert [m.what for m in tc.check_netem(p, qdiscs)] == ["netem delay (ms)"]


@pytest.mark.root
def test_real_tc_encodes_the_netem_request(tmp_path):
    """tc parses the options and sends them; without sch_netem only the kernel may refuse."""
    if kernel_has_netem():
        pytest.skip("this kernel has netem: covered by tests/netem")
    ns = "tbtctest"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        ipn = ["ip", "netns", "exec", ns]
        subprocess.run(ipn + ["ip", "link", "add", "tqa", "type", "veth", "peer", "name", "tqb"],
                       check=True)
        p = LinkProfile(delay_ms=7, jitter_ms=1, jitter_distribution="normal", loss_pct=1,
                        rate_mbit=100)
        res = subprocess.run(ipn + tc.netem_argvs("tqa", p)[0], capture_output=True, text=True)
        assert res.returncode != 0
        assert "qdisc kind is unknown" in res.stderr, res.stderr
    finally:
        subprocess.run(["ip", "netns", "del", ns])
