"""Shaping for real on this kernel: the delay line (delay, steps, loss), htb rate, read-back.

Tolerances hold on a busy 2-core machine; tight numbers live in benchmarks/bench_delayline.py.
The netem shaper needs sch_netem, which this kernel lacks: tests/netem/ runs it in UML.
"""
from __future__ import annotations

import json
import re
import signal
import statistics
import subprocess
import sys
import time

import pytest

from testbed.errors import ShapingError
from testbed.net.backends import emulated_network
from testbed.net.linkprobe import percentile, rtt_samples, throughput
from testbed.net.shaping import shapers
from testbed.net.shaping.nfqueue import queue_table
from testbed.net.steps import StepPlayer
from testbed.topology import LinkProfile, Topology
from twodc import ends, two_dc, two_dc_stepping

pytestmark = pytest.mark.root

# A userspace release loop on a shared 2-core box: the median RTT may be off by scheduling
# noise of a few hundred µs, and more when the suite runs other work beside it.
RTT_SLACK_MS = 1.5
# iperf3 counts payload only (1448 of 1514 bytes per frame: -4.4 %), over 2 s with slow start
# left out; the rest of the ±15 % is CPU contention on 2 cores.
RATE_SLACK = 0.15


@pytest.mark.alone  # measured RTT within RTT_SLACK_MS: measured time
@pytest.mark.apart_from_quiet
def test_delay_line_gives_the_configured_rtt(tmp_path):
    """Bounds the lower quartile of 30 pings: a delay computed wrong in either direction, or
    releases late for most packets, moves it. A machine that wakes the delay line late moves
    only the later pings: a CI run's median was 32.0 ms for 30, and here, with two CPU hogs
    or the user-mode kernel beside it, single releases came 1-9 ms late (SCHED_FIFO did not
    help). The median's target is benchmarks/bench_delayline.py's, on a quiet machine."""
    with emulated_network(two_dc(delay_ms=15), shaper="delayline", workdir=tmp_path) as (net, sh):
        lower_quartile = percentile(rtt_samples(net, *ends(net), count=30), 25)
        assert abs(lower_quartile - 30) < RTT_SLACK_MS, lower_quartile
        assert sh.drops() == 0


@pytest.mark.alone  # measured rate within RATE_SLACK: measured time
def test_rate_is_shaped_by_htb_behind_the_delay_line(tmp_path):
    topo = two_dc(delay_ms=5, rate_mbit=100)
    with emulated_network(topo, shaper="delayline", workdir=tmp_path) as (net, sh):
        mbit = throughput(net, *ends(net), seconds=2)
        assert abs(mbit - 100) < 100 * RATE_SLACK, mbit


@pytest.mark.alone  # measured RTT within RTT_SLACK_MS: measured time
@pytest.mark.apart_from_quiet
def test_step_changes_rtt_while_running(tmp_path):
    """Bounds the least ping of each side of the step: the path's delay plus the least
    wake-up. Quiet tests run beside alone ones, and a CI run's median before the step was
    11.66 ms for 10 ms; the median's fidelity is bench_delayline.py's. A step not applied, or
    applied in one direction only, leaves the least after it at 10 or 30 ms."""
    topo = two_dc(delay_ms=5)
    with emulated_network(topo, shaper="delayline", workdir=tmp_path) as (net, sh):
        before = min(rtt_samples(net, *ends(net), count=10))
        link = net.links[0]
        sh.update(link.index, LinkProfile(delay_ms=25), LinkProfile(delay_ms=25))
        after = min(rtt_samples(net, *ends(net), count=10))
    assert abs(before - 10) < RTT_SLACK_MS and abs(after - 50) < RTT_SLACK_MS, (before, after)


@pytest.mark.alone  # measured rate within RATE_SLACK: measured time
def test_step_changes_rate_and_queue_in_place(tmp_path):
    topo = two_dc(delay_ms=2, rate_mbit=200)
    with emulated_network(topo, shaper="delayline", workdir=tmp_path) as (net, sh):
        new = LinkProfile(delay_ms=20, rate_mbit=50)
        sh.update(net.links[0].index, new, new)  # verifies rate, the BDP-sized queue and rules
        mbit = throughput(net, *ends(net), seconds=2)
    assert abs(mbit - 50) < 50 * RATE_SLACK, mbit


def test_bernoulli_loss_drops_about_the_configured_share(tmp_path):
    topo = two_dc(delay_ms=1, loss_pct=30)
    with emulated_network(topo, shaper="delayline", workdir=tmp_path) as (net, sh):
        a, b = ends(net)
        res = net.run(a, ["ping", "-n", "-c", "300", "-i", "0.002", "-W", "1", str(b.ip)],
                      check=False)
    lost = float(re.search(r"([0-9.]+)% packet loss", res.stdout).group(1))
    # a round trip survives with 0.7² = 49 %: about 51 % lost; 300 pings give ±9 % at 3σ
    assert 40 < lost < 62, lost


def test_read_back_catches_a_queue_changed_behind_our_back(tmp_path):
    topo = two_dc(delay_ms=1, rate_mbit=50)
    with emulated_network(topo, shaper="delayline", workdir=tmp_path) as (net, sh):
        end = net.link_ends[0]
        net.run(end.router, ["tc", "qdisc", "change", "dev", end.iface, "parent", "1:1",
                             "handle", "10:", "bfifo", "limit", "3000"])
        with pytest.raises(ShapingError, match="queue"):
            sh.verify()


def test_a_dead_delay_line_fails_verification(tmp_path):
    with emulated_network(two_dc(delay_ms=1), shaper="delayline", workdir=tmp_path) as (net, sh):
        sh.directions[0].proc.kill()
        sh.directions[0].proc.wait()
        with pytest.raises(ShapingError, match="delay-line process"):
            sh.verify()


def test_a_delay_line_held_up_counts_its_release_late(tmp_path):
    with emulated_network(two_dc(delay_ms=3000), shaper="delayline", workdir=tmp_path) as (
            net, sh):
        a, b = ends(net)
        held = sh.directions[0]  # a→b
        before = written_stats(sh)[held.label]  # what building the network sent through it
        ping = net.popen(a, ["ping", "-n", "-c", "1", "-W", "20", str(b.ip)],
                         stdout=subprocess.PIPE, text=True)
        # the echo request queued for the delay line (the kernel keeps it until its verdict),
        # then read by it, which waits on the queue: now held, due 3 s after it came
        deadline = time.monotonic() + 5
        while queue_table(net, held.end.router)[held.queue]["held"] == 0 \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # (a wake-up on a busy machine: tens of ms at worst, measured)
        held.proc.send_signal(signal.SIGSTOP)  # its release comes >= 0.5 s after it was due
        time.sleep(3.5)
        held.proc.send_signal(signal.SIGCONT)
        out, _ = ping.communicate(timeout=20)
        assert "1 received" in out, out
        asked = time.monotonic()
        after = written_stats(sh)[held.label]
        # each delay line answered the request for fresh statistics, none waited for
        assert time.monotonic() - asked < shapers.STATS_WAIT_S
    # the request's one release was late, and counted so
    assert (after["releases"] - before["releases"],
            after["late_releases"] - before["late_releases"]) == (1, 1), (before, after)
    assert after["late_max_us"] >= 0.5e6, (before, after)


def written_stats(sh) -> dict[str, dict]:
    """Each delay line's statistics, fresh: ``releases`` asks each to write them (SIGUSR1)
    and waits until it has."""
    sh.releases()
    return sh.stats()


def test_intra_dc_delay_is_refused_by_the_delay_line(tmp_path, netns_list):
    # DC names no other test uses: other runs on this machine add and remove namespaces too
    topo = Topology(name="t", dcs=[{"name": "dcw", "hosts": 1, "intra": {"delay_ms": 1}},
                                   {"name": "dcz", "hosts": 1}])
    before = netns_list()
    with pytest.raises(ShapingError, match="needs netem"):
        with emulated_network(topo, shaper="delayline", workdir=tmp_path):
            pass
    assert [n for n in netns_list() - before if "-dcw" in n or "-dcz" in n] == []


def test_stopped_delay_line_releases_what_it_held(tmp_path):
    with emulated_network(two_dc(delay_ms=200), shaper="delayline", workdir=tmp_path) as (net, sh):
        a, b = ends(net)
        ping = net.popen(a, ["ping", "-n", "-c", "1", "-W", "3", str(b.ip)],
                         stdout=subprocess.PIPE, text=True)
        time.sleep(0.05)  # the echo request is now held in a→b
        held = sh.directions[0]
        held.proc.terminate()  # stop a→b only; the reply still crosses b→a's delay line
        held.proc.wait(timeout=5)
        out, _ = ping.communicate(timeout=10)
    assert "1 received" in out, out


@pytest.mark.alone  # measured RTT within RTT_SLACK_MS: measured time
@pytest.mark.apart_from_quiet
def test_steps_play_at_their_time(tmp_path):
    """Bounds the least ping of each side of the step, as test_step_changes_rtt_while_running
    does: a suite run on a machine waking late measured a median of 62.1 ms for 60 after it,
    alone. A step not played, or played after the second pings, leaves the least at 10 ms."""
    topo = two_dc_stepping(5, at_s=1.0, to_delay_ms=30)
    with emulated_network(topo, shaper="delayline", workdir=tmp_path) as (net, sh):
        player = StepPlayer(sh, net.links)
        player.start()
        before = min(rtt_samples(net, *ends(net), count=10))  # ~0.2 s of pings, before 1 s
        time.sleep(1.2)
        after = min(rtt_samples(net, *ends(net), count=10))
        player.stop()
    assert abs(before - 10) < RTT_SLACK_MS and abs(after - 60) < RTT_SLACK_MS, (before, after)
    assert player.applied and player.applied[0]["applied_s"] >= 1.0


@pytest.mark.alone  # measured rate within RATE_SLACK: measured time
def test_intra_dc_rate_is_shaped_on_both_ends_of_host_links(tmp_path):
    topo = Topology(name="t", dcs=[{"name": "dca", "hosts": 2, "intra": {"rate_mbit": 200}},
                                   {"name": "dcb", "hosts": 1}])
    with emulated_network(topo, shaper="delayline", workdir=tmp_path) as (net, sh):
        a0, a1 = net.host("dca", 0), net.host("dca", 1)
        mbit = throughput(net, a0, a1, seconds=2)
    assert abs(mbit - 200) < 200 * RATE_SLACK, mbit


def test_read_back_catches_a_changed_drop_probability(tmp_path):
    with emulated_network(two_dc(delay_ms=1, loss_pct=30), shaper="delayline",
                          workdir=tmp_path) as (net, sh):
        d = sh.directions[0]
        drop = next(r for r in d.rules if "DROP" in r)
        changed = [x if x != "0.3" else "0.1" for x in drop]
        net.run(d.end.router, ["iptables", "-w", "-R", "FORWARD", "1", *changed[1:]])
        with pytest.raises(ShapingError, match="Bernoulli drop rule"):
            sh.verify()


def test_read_back_catches_a_delay_line_running_another_config(tmp_path):
    with emulated_network(two_dc(delay_ms=5, jitter_ms=1), shaper="delayline",
                          workdir=tmp_path) as (net, sh):
        d = sh.directions[0]
        loads = sh._stats(d)["config_loads"]
        d.config.write_text('{"delay_ms": 5, "jitter_ms": 0}')  # behind the shaper's back
        d.proc.send_signal(signal.SIGHUP)
        sh._wait_reload(d, loads)
        with pytest.raises(ShapingError, match="delay-line config in force"):
            sh.verify()


def test_a_step_whose_reload_times_out_fails_and_is_not_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(shapers, "DELAYLINE_START_TIMEOUT_S", 1.0)
    topo = two_dc_stepping(5, at_s=0.1, to_delay_ms=30)
    with emulated_network(topo, shaper="delayline", workdir=tmp_path) as (net, sh):
        frozen = sh.directions[0].proc
        frozen.send_signal(signal.SIGSTOP)  # alive, but never reloads
        try:
            player = StepPlayer(sh, net.links)
            player.start()
            with pytest.raises(ShapingError, match="did not load its new config within 1 s"):
                time.sleep(0.1 + 1.5)
                player.stop()
        finally:
            frozen.send_signal(signal.SIGCONT)
    assert player.applied == []


UDP_RECEIVER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 9999)); s.settimeout(3)
print("ready", flush=True)
got = []
try:
    while True:
        got.append(int(s.recv(64)))
except socket.timeout:
    pass
print(" ".join(map(str, got)), flush=True)
"""
UDP_SENDER = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(int(sys.argv[2])):
    s.sendto(str(i).encode(), (sys.argv[1], 9999)); time.sleep(0.0002)
"""


@pytest.mark.alone  # the delays of real packets are measured time
@pytest.mark.apart_from_quiet
def test_jitter_on_real_packets_spreads_delays_but_never_reorders(tmp_path):
    """500 datagrams 0.2 ms apart through 10 ms ± 4 ms of jitter arrive in order, and the
    echo RTTs of sparse pings spread as the jitter says (both directions jittered)."""
    with emulated_network(two_dc(delay_ms=10, jitter_ms=4), shaper="delayline",
                          workdir=tmp_path) as (net, sh):
        a, b = ends(net)
        rx = net.popen(b, [sys.executable, "-c", UDP_RECEIVER], stdout=subprocess.PIPE,
                       text=True)
        assert rx.stdout.readline().strip() == "ready"
        net.run(a, [sys.executable, "-c", UDP_SENDER, str(b.ip), "500"])
        order = [int(x) for x in rx.communicate(timeout=30)[0].split()]
        probe = net.run(a, [sys.executable, "-m", "testbed.net.icmp", str(b.ip), "60", "0.05"])
    rtts = json.loads(probe.stdout)["rtt_ms"]
    assert len(order) >= 490 and order == sorted(order), order[:50]
    # each direction adds N(0, 4 ms) (clipped at 0): RTT spread ≈ √2 · 4 = 5.7 ms; 60 samples
    # and scheduling noise on a busy machine: between 3.5 and 8 ms
    assert 3.5 < statistics.pstdev(rtts) < 8, rtts
