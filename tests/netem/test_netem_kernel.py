"""netem for real: the netem shaper and the remote backend's netem leaf on a kernel with sch_netem.

This machine's kernel has none, so tests/conftest.py runs these inside a user-mode Linux 6.1
kernel (tests/umlkernel.py) that has it; on a lab kernel with netem they run directly. They never
skip: a kernel that cannot run them is a failure (CI) or a skip saying how to get one (elsewhere).
"""
from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import time

import pytest

from testbed.errors import ShapingError
from testbed.net.backends import emulated_network
from testbed.net.linkprobe import rtt
from testbed.net.shaping import tc
from testbed.net.steps import StepPlayer
from testbed.topology import GilbertElliott, LinkProfile
from testbed.net.lab import nic as remote
from twodc import ends, two_dc, two_dc_stepping

pytestmark = [pytest.mark.root, pytest.mark.netem]

# netem delays by the guest kernel's timer; UML's timer is a host process's timer (hrtimers on
# a process that itself waits for the host scheduler), so on a busy 2-core host a packet leaves
# up to a few ms late. netem never sends early: measured RTTs must lie in
# [configured, configured + slack]. Measured in UML here: 20 ms configured gave medians of
# 20.2–22 ms (single pings up to 24 ms, the first one ~40 ms: ARP).
UML_RTT_SLACK_MS = 4.0
# A step is applied by a thread running three tc commands (change, then the read-back). In UML
# every fork+exec is slow (guest processes are host processes, page tables rebuilt by the
# guest kernel), and the RTT probe's Python starts at the same moment: steps landed 0.3–1.7 s
# after their planned time here on a busy 2-core host. Lateness is recorded in `applied_s`.
STEP_LATENESS_S = 5.0


def _root_netem(net, end) -> dict:
    q = tc.parse_json(net.run(end.router, tc.SHOW_QDISC + [end.iface]).stdout)
    return next(x for x in q if x.get("handle") == "1:")


def _assert_rtt(measured: float, configured: float) -> None:
    assert configured - 0.05 <= measured <= configured + UML_RTT_SLACK_MS, (measured, configured)


def test_netem_shaper_builds_two_dcs_reads_back_and_gives_the_rtt(tmp_path):
    topo = two_dc(delay_ms=10, rate_mbit=100)
    with emulated_network(topo, shaper="netem", workdir=tmp_path) as (net, sh):
        sh.verify()  # apply() verified too; read it back once more while traffic is idle
        for end in net.link_ends:
            q = tc.parse_json(net.run(end.router, tc.SHOW_QDISC + [end.iface]).stdout)
            root = next(x for x in q if x.get("handle") == "1:")
            tbf = next(x for x in q if x.get("handle") == "10:")
            assert root["kind"] == "netem" and root["options"]["delay"]["delay"] == 0.010
            assert tbf["kind"] == "tbf" and tbf["options"]["rate"] == 100e6 / 8
        rtt(net, *ends(net), count=3)  # ARP and first-packet costs out of the measurement
        median, _ = rtt(net, *ends(net), count=20)
    _assert_rtt(median, 20.0)


def test_netem_read_back_covers_jitter_loss_model_limit_and_queue(tmp_path):
    topo = two_dc(delay_ms=8, jitter_ms=1, jitter_distribution="pareto", loss_pct=0.5,
                  rate_mbit=50, queue={"packets": 120})
    with emulated_network(topo, shaper="netem", workdir=tmp_path) as (net, sh):
        end = net.link_ends[0]
        p = end.link.a_to_b
        tamper = {"netem jitter": ["tc", "qdisc", "change", "dev", end.iface, "root", "handle",
                                   "1:", "netem", *tc.netem_args(p.merged(
                                       LinkProfile(jitter_ms=3)))],
                  "netem loss": ["tc", "qdisc", "change", "dev", end.iface, "root", "handle",
                                 "1:", "netem", *tc.netem_args(p.merged(
                                     LinkProfile(loss_pct=2)))],
                  "tbf limit": ["tc", "qdisc", "change", "dev", end.iface, "parent", "1:1",
                                "handle", "10:", "tbf", "rate", "50mbit", "burst",
                                str(tc.burst_bytes(50)), "limit", "3000"]}
        for what, argv in tamper.items():
            net.run(end.router, argv)
            with pytest.raises(ShapingError, match=what):
                sh.verify()
            sh.update(end.link.index, end.link.a_to_b, end.link.b_to_a)  # put it right
        ge = p.merged(LinkProfile(loss_model="gilbert_elliott", gilbert_elliott=GilbertElliott(
            p_pct=1, r_pct=20, loss_bad_pct=50, loss_good_pct=0.1)))
        sh.update(end.link.index, ge, ge)  # verifies the gemodel's four parameters
        assert _root_netem(net, end)["options"]["loss-gemodel"]["1-k"] == pytest.approx(0.999)


def test_time_varying_step_is_applied_and_read_back(tmp_path):
    topo = two_dc_stepping(5, at_s=1.5, to_delay_ms=20)
    with emulated_network(topo, shaper="netem", workdir=tmp_path) as (net, sh):
        player = StepPlayer(sh, net.links)
        # the RTT before the step is measured before the player starts: in UML the probe's
        # Python alone can take longer than 1.5 s to start, and CI once had its pings straddle
        # the step (median 25.4 ms for 10 configured)
        before, _ = rtt(net, *ends(net), count=10)
        player.start()
        deadline = time.monotonic() + 1.5 + STEP_LATENESS_S
        while not player.applied and time.monotonic() < deadline:
            time.sleep(0.05)
        after, _ = rtt(net, *ends(net), count=10)
        delays = [_root_netem(net, e)["options"]["delay"]["delay"] for e in net.link_ends]
        player.stop()
    assert player.applied and 1.5 <= player.applied[0]["applied_s"] <= 1.5 + STEP_LATENESS_S
    assert delays == [0.020, 0.020]
    _assert_rtt(before, 10.0)
    _assert_rtt(after, 40.0)


NS_SRC, NS_DST = f"tbnetemsrc{os.getpid()}", f"tbnetemdst{os.getpid()}"


@pytest.fixture
def lab_nic():
    """Two namespaces joined by a veth: ``src`` (10.77.1.1/16, dev eth0) stands for a lab
    host's NIC; ``dst`` answers on 10.77.2.1 (DC b) and 10.77.3.1 (DC c). Always removed."""
    def ip(*argv):
        subprocess.run(["ip", *argv], check=True, capture_output=True)
    ip("netns", "add", NS_SRC)
    try:
        ip("netns", "add", NS_DST)
        ip("-n", NS_SRC, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0",
           "netns", NS_DST)
        ip("-n", NS_SRC, "addr", "add", "10.77.1.1/16", "dev", "eth0")
        for a in ("10.77.2.1/16", "10.77.3.1/16"):
            ip("-n", NS_DST, "addr", "add", a, "dev", "eth0")
        for ns in (NS_SRC, NS_DST):
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield ["ip", "netns", "exec", NS_SRC]
    finally:
        subprocess.run(["ip", "netns", "del", NS_SRC], check=False)
        subprocess.run(["ip", "netns", "del", NS_DST], check=False)


def _remote_read(inside: list[str]):
    def out(argv):
        return subprocess.run(inside + argv, check=True, capture_output=True, text=True).stdout
    return (tc.parse_json(out(tc.SHOW_QDISC + ["eth0"])),
            tc.parse_classes(out(tc.SHOW_CLASS + ["eth0"])),
            remote.parse_u32(out(["tc", "filter", "show", "dev", "eth0"])))


def _median_rtt_ms(inside: list[str], dest: str) -> float:
    res = subprocess.run(inside + ["ping", "-n", "-c", "12", "-i", "0.1", dest],
                         check=True, capture_output=True, text=True).stdout
    times = sorted(float(x.split("time=")[1].split()[0]) for x in res.splitlines()
                   if "time=" in x)[1:]  # the first carries ARP
    return times[len(times) // 2]


def test_remote_netem_leaf_on_a_real_nic(lab_nic):
    """The remote backend's tc argv (htb root, per-destination netem + tbf leaf, u32 filters)
    run on a real NIC; read back, compared, and the delay is per destination."""
    routes = [remote.Route("dcb", remote.minor(1), [ipaddress.ip_network("10.77.2.0/24")],
                           LinkProfile(delay_ms=10, jitter_ms=0.5, loss_pct=0.1, rate_mbit=100)),
              remote.Route("dcc", remote.minor(2), [ipaddress.ip_network("10.77.3.0/24")],
                           LinkProfile(delay_ms=0, rate_mbit=50))]
    for argv in remote.host_argvs("eth0", routes):
        subprocess.run(lab_nic + argv, check=True, capture_output=True)
    assert remote.check(routes, *_remote_read(lab_nic)) == []
    delayed, direct = _median_rtt_ms(lab_nic, "10.77.2.1"), _median_rtt_ms(lab_nic, "10.77.3.1")
    # one direction is delayed (the NIC's egress): RTT ≈ 10 ms towards dcb, ≈ 0 towards dcc
    assert 10 - 1.5 <= delayed <= 10 + UML_RTT_SLACK_MS, delayed
    assert direct < 10 - 1.5, direct
    # changed behind our back: the read-back must name it
    subprocess.run(lab_nic + ["tc", "qdisc", "change", "dev", "eth0", "parent", "1:11",
                              "handle", "1100:", "netem", "delay", "30ms"], check=True)
    assert any("dcb" in m.what for m in remote.check(routes, *_remote_read(lab_nic)))
    subprocess.run(lab_nic + tc.delete_root_argv("eth0"), check=True)
    assert remote.check(routes, *_remote_read(lab_nic)) != []


UDP_BURST = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(300):
    s.sendto(b"x" * 1400, (sys.argv[1], 9))
"""


def _drop_counters(net) -> dict[str, tuple[int, int]]:
    """Per sending DC: (netem's drops, tbf's drops)."""
    out = {}
    for end in net.link_ends:
        q = tc.parse_json(net.run(end.router, tc.SHOW_QDISC + [end.iface]).stdout)
        out[end.router.dc] = (tc.drops(q, "1:"), tc.drops(q, "10:"))
    return out


def _resolve_neighbours_through_loss(net, a, b, tries: int = 8) -> None:
    """Ping until a reply comes back: every ARP entry on the way there and back is then
    resolved. A burst sent earlier waits in ARP's unresolved queue (about 100 packets, the
    rest dropped before any qdisc sees them), and with 20 % loss each way a fixed number of
    pings can end before resolution does (CI once saw 2 netem drops and no burst)."""
    for _ in range(tries):
        if net.run(a, ["ping", "-n", "-q", "-c", "10", "-i", "0.1", "-W", "1", str(b.ip)],
                   check=False, timeout=60).returncode == 0:
            return
    raise AssertionError(f"no ping reply from {b.ip} in {tries} rounds of 10")


def test_netem_reports_its_drop_counters_and_no_emulator_drops(tmp_path):
    """netem's counter holds its configured loss and its tbf child's queue drops (netem counts
    a child's drop again): queue_drops reports it; drops() (the emulator's own) is empty."""
    topo = two_dc(delay_ms=1, loss_pct=20, rate_mbit=1, queue={"bytes": 3000})
    with emulated_network(topo, shaper="netem", workdir=tmp_path) as (net, sh):
        a, b = ends(net)
        _resolve_neighbours_through_loss(net, a, b)
        # 300 × 1.4 KB at once: far more than tbf's burst (2 × 64 KB) and 3000 bytes of queue
        net.run(a, [sys.executable, "-c", UDP_BURST, str(b.ip)], timeout=60)
        before = _drop_counters(net)
        reported = sh.queue_drops()
        after = _drop_counters(net)  # IPv6 neighbour traffic meets the 20 % loss at any time
        assert sh.drops() is None
    assert (sum(root for root, _ in before.values()) <= reported
            <= sum(root for root, _ in after.values())), (before, reported, after)
    netem_a, tbf_a = before["dca"]
    assert tbf_a > 0 and netem_a > tbf_a, before  # the queue overflowed, and loss on top
