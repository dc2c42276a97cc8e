"""Link probes: what each inter-DC link of a built network really does (RTT with ping, rate
with iperf3), measured against what it was configured to do (the row's link columns).

A probe waits on the link's shaping: a delay line that died drops every packet, and the probe
would wait for its own timeout. So each probe takes a ``watch`` (the runner's check of the
parts it started), called while the probe's commands run; what it raises ends the probe."""
from __future__ import annotations

import json
import logging
import math
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

from testbed.errors import NetworkError
from testbed.net.network import Network, Node
from testbed.process import STOP_GRACE_S
from testbed.topology import ResolvedLink

log = logging.getLogger(__name__)

PING_COUNT = 40
PING_INTERVAL_S = 0.01
IPERF_SECONDS = 1.0
# leave slow start out of the average: it lasts 10-20 round trips (cubic leaves it early on a
# delay jump), so 25 are omitted, in whole seconds (iperf3 reads -t and -O as integers: it
# took "-O 0.5" for no omission at all), at least 1 s, at most 2 s (2 s from 80 ms RTT). On a
# 500 Mbit/s link of 20 ms RTT the four flows' slow start overran the queue about 0.7 s in (a
# thousand retransmissions), so a probe that omitted nothing read 437 Mbit/s; omitting 1 s it
# read 478, what TCP's payload can carry (1448 of every 1514 bytes the shaper counts: 95.6 %
# of the configured rate), as a 6 s test did over seconds 1 to 6.
IPERF_OMIT_RTTS = 25
IPERF_OMIT_MIN_S, IPERF_OMIT_MAX_S = 1.0, 2.0
IPERF_OMIT_S = 1.0      # for callers that do not say
IPERF_STREAMS = 4       # several connections fill a long fat link within the short test
IPERF_PORT = 5201
# iperf3's server takes a while to listen on a busy machine: up to 50 × 0.1 s
IPERF_CONNECT_TRIES = 50
IPERF_CONNECT_WAIT_S = 0.1


@dataclass
class LinkMeasurement:
    """Configured vs measured for one inter-DC link (RTT both ways, rate a → b)."""

    link: str
    rtt_ms_configured: float
    rate_mbit_configured: float | None
    rtt_ms: float | None = None
    rtt_ms_p99: float | None = None
    rate_mbit: float | None = None

    def as_dict(self) -> dict:
        return {"rtt_ms": self.rtt_ms, "rtt_ms_p99": self.rtt_ms_p99, "rate_mbit": self.rate_mbit}


def endpoints(net: Network, link: ResolvedLink) -> tuple[Node, Node]:
    """The hosts whose traffic crosses ``link``: host 0 of each side's DC."""
    return net.host(link.a, 0), net.host(link.b, 0)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks."""
    v = sorted(values)
    k = (len(v) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


Watch = Callable[[], None] | None


def rtt(net: Network, src: Node, dst: Node, count: int = PING_COUNT,
        watch: Watch = None) -> tuple[float, float]:
    """Median and p99 RTT in ms from ``count`` ICMP echoes (µs resolution, kernel receive
    timestamps: see testbed.net.icmp); raises NetworkError when none return."""
    samples = rtt_samples(net, src, dst, count, watch)
    return statistics.median(samples), percentile(samples, 99)


def rtt_samples(net: Network, src: Node, dst: Node, count: int = PING_COUNT,
                watch: Watch = None) -> list[float]:
    """The RTT in ms of each echo that returned; raises NetworkError when none return."""
    res = net.run(src, [sys.executable, "-m", "testbed.net.icmp", str(dst.ip), str(count),
                        str(PING_INTERVAL_S)], check=False, timeout=60 + count * PING_INTERVAL_S,
                  watch=watch)
    try:
        samples = json.loads(res.stdout)["rtt_ms"]
    except (ValueError, KeyError):
        samples = []
    if not samples:
        raise NetworkError(f"no echo reply from {dst.name} ({dst.ip}) to {src.name}: "
                           f"{(res.stdout + res.stderr).strip()[-300:]}")
    return samples


def omit_s(rtt_ms: float) -> int:
    """Whole seconds of an iperf3 test to leave out at a round trip of ``rtt_ms`` (slow
    start)."""
    return int(min(IPERF_OMIT_MAX_S, max(IPERF_OMIT_MIN_S,
                                         math.ceil(IPERF_OMIT_RTTS * rtt_ms / 1000))))


def throughput(net: Network, src: Node, dst: Node, seconds: float = IPERF_SECONDS,
               streams: int = 1, omit: float = IPERF_OMIT_S, watch: Watch = None) -> float:
    """TCP payload throughput src → dst in Mbit/s (iperf3 with ``streams`` connections, the
    first ``omit`` seconds, slow start, left out). ``seconds`` and ``omit`` are whole seconds:
    iperf3 reads -t and -O as integers, so "-O 0.5" would silently omit nothing."""
    if not (float(seconds).is_integer() and float(omit).is_integer()):
        raise ValueError(f"iperf3 takes whole seconds: -t {seconds:g} -O {omit:g}")
    server = net.popen(dst, ["iperf3", "-s", "-1", "-p", str(IPERF_PORT)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        res = None
        for _ in range(IPERF_CONNECT_TRIES):  # the server needs a moment to listen
            time.sleep(IPERF_CONNECT_WAIT_S)
            res = net.run(src, ["iperf3", "-c", str(dst.ip), "-p", str(IPERF_PORT), "-J",
                                "-t", str(int(seconds)), "-O", str(int(omit)),
                                "-P", str(streams)],
                          check=False, timeout=seconds + 60, watch=watch)
            # iperf3 -J exits 0 even when it could not connect: its JSON says so
            if "Connection refused" not in res.stdout:
                break
        data = json.loads(res.stdout)
        if "error" in data:
            raise NetworkError(f"iperf3 {src.name} → {dst.name}: {data['error']}")
        return data["end"]["sum_received"]["bits_per_second"] / 1e6
    except (ValueError, KeyError) as e:
        raise NetworkError(f"iperf3 {src.name} → {dst.name} gave no result: {e}") from e
    finally:
        server.kill()
        try:
            server.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            log.warning("iperf3 server in %s (pid %s) still runs after SIGKILL", dst.name,
                        server.pid)


def probe_link(net: Network, link: ResolvedLink, rate: bool = True,
               watch: Watch = None) -> LinkMeasurement:
    """RTT (median, p99) between the link's DCs and, if ``rate``, TCP throughput a → b."""
    a, b = endpoints(net, link)
    m = LinkMeasurement(link.name, link.a_to_b.one_way_delay_ms + link.b_to_a.one_way_delay_ms,
                        link.a_to_b.rate_mbit)
    m.rtt_ms, m.rtt_ms_p99 = (round(x, 3) for x in rtt(net, a, b, watch=watch))
    if rate:
        m.rate_mbit = round(throughput(net, a, b, streams=IPERF_STREAMS,
                                       omit=omit_s(m.rtt_ms_configured), watch=watch), 1)
    return m


def probe_all(net: Network, rate: bool = True) -> list[LinkMeasurement]:
    """Measure every inter-DC link, one after the other (so they do not share the CPU)."""
    return [probe_link(net, link, rate) for link in net.links]
