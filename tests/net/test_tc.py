"""What the shapers send to the kernel: tc argv for netem (absent here) and htb, and read-back.

netem is not in this machine's kernel, so the netem request is tested two ways: its argv
(unit), and by handing it to the real ``tc``, which must parse and encode it and get the
*kernel's* "unknown qdisc" refusal rather than a parse error of its own.
"""
from __future__ import annotations

import subprocess

import pytest

from testbed.net.shaping import tc
from testbed.topology import GilbertElliott, LinkProfile
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


# What `tc -j -s -r qdisc show` printed in the UML 6.1 kernel for KERNEL_PROFILE's netem + tbf
# request (netem's limit filled in from netem_limit; tests/netem runs such requests for real).
KERNEL_PROFILE = LinkProfile(delay_ms=8, jitter_ms=1, jitter_distribution="pareto", loss_pct=0.5,
                             rate_mbit=50, queue={"bytes": 180000})
KERNEL_JSON = (
    '[{"kind":"netem","handle":"1:","root":true,"refcnt":2,"options":{"limit":%d,'
    '"delay":{"delay":0.008,"jitter":0.001,"correlation":0},"loss-random":{"loss":0.005,'
    '"correlation":0},"ecn":false,"gap":0},"bytes":0,"packets":0,"drops":0},'
    '{"kind":"tbf","handle":"10:","parent":"1:1","options":{"rate":6250000,"burst":131068,'
    '"burst_raw":"50000","lat":7829,"limit":180000},"bytes":0,"packets":0,"drops":0}]'
    % tc.netem_limit(KERNEL_PROFILE))


def _kernel_qdiscs() -> list[dict]:
    return tc.parse_json(KERNEL_JSON)


def test_check_netem_accepts_what_the_kernel_reports_for_the_request():
    assert tc.check_netem(KERNEL_PROFILE, _kernel_qdiscs()) == []


@pytest.mark.parametrize("field, value, named", [
    ("delay", 0.009, "netem delay"), ("jitter", 0.002, "netem jitter"),
    ("loss", 0.01, "netem loss"), ("limit", 10, "netem limit"),
    ("tbf_limit", 3000, "tbf limit"), ("tbf_rate", 3125000, "tbf rate")])
def test_check_netem_names_each_parameter_that_differs(field, value, named):
    q = _kernel_qdiscs()
    netem, tbf = q[0]["options"], q[1]["options"]
    target = {"delay": (netem["delay"], "delay"), "jitter": (netem["delay"], "jitter"),
              "loss": (netem["loss-random"], "loss"), "limit": (netem, "limit"),
              "tbf_limit": (tbf, "limit"), "tbf_rate": (tbf, "rate")}[field]
    target[0][target[1]] = value
    assert [m.what for m in tc.check_netem(KERNEL_PROFILE, q)] == [named + (
        " (ms)" if field in ("delay", "jitter") else " (bytes)" if field == "tbf_limit"
        else " (bytes/s)" if field == "tbf_rate" else "")]


def test_check_netem_compares_the_loss_model_not_only_its_rate():
    ge = KERNEL_PROFILE.merged(LinkProfile(loss_model="gilbert_elliott", gilbert_elliott={
        "p_pct": 1, "r_pct": 20, "loss_bad_pct": 50, "loss_good_pct": 0.1}))
    found = tc.check_netem(ge, _kernel_qdiscs())  # the kernel has random loss, not gemodel
    assert [m.what for m in found] == ["netem loss"]
    q = _kernel_qdiscs()
    del q[0]["options"]["loss-random"]
    q[0]["options"]["loss-gemodel"] = {"p": 0.01, "r": 0.2, "1-h": 0.5, "1-k": 0.999}
    assert tc.check_netem(ge, q) == []
    assert [m.what for m in tc.check_netem(KERNEL_PROFILE, q)] == ["netem loss"]


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
