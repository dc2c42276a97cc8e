"""What the machines of a ``backend: cluster`` network offer and what joins them.

``probe_capacity``: each machine's cores, memory and GPUs (the inventory's values where given,
else read on the machine). ``measure_underlay``: the round trip (ICMP, median) and TCP rate
between every two machines a tunnel joins, measured between the machines themselves (not
through the emulation): what the underlay adds to every emulated link it carries.
"""
from __future__ import annotations

from testbed.net.cluster.placement import Machine
from testbed.net.lab import ssh
from testbed.net.lab.lab import Lab
from testbed.net.linkprobe import rtt, throughput

CAPACITY_PROBE = ["sh", "-c", "nproc; awk '/^MemTotal:/ {print $2}' /proc/meminfo"]
UNDERLAY_PING_COUNT = 20
UNDERLAY_IPERF_S = 1.0


def probe_capacity(lab: Lab) -> list[Machine]:
    """Every machine of ``lab`` with what it offers, in inventory order."""
    def read(h, conn):
        if h.cores is not None and h.memory_gb is not None:
            return h.cores, h.memory_gb
        cores, mem_kb = ssh.run(conn, h, CAPACITY_PROBE).stdout.split()[:2]
        return (h.cores if h.cores is not None else int(cores),
                h.memory_gb if h.memory_gb is not None else round(int(mem_kb) / 2**20, 1))
    found = lab.each(read, "reading cores and memory")
    return [Machine(h.name, found[h.name][0], found[h.name][1],
                    h.gpus if h.gpus is not None else lab.gpus.get(h.name, 0))
            for h in lab.hosts()]


def tunnel_pairs(net) -> list[tuple[str, str]]:
    """The pairs of machines at least one inter-DC link joins, in link order."""
    out: list[tuple[str, str]] = []
    for link in net.links:
        pair = (net.spread.placed[link.a], net.spread.placed[link.b])
        if pair[0] != pair[1] and pair not in out and pair[::-1] not in out:
            out.append(pair)
    return out


def measure_underlay(net) -> dict[str, dict[str, float | None]]:
    """``"m1-m2"`` → its RTT (ms, median) and TCP rate m1 → m2 (Mbit/s) for every pair of
    machines a tunnel joins (``net``: a network spread over machines, ``net.spread``)."""
    out = {}
    for a, b in tunnel_pairs(net):
        src, dst = net.machine_node(a), net.machine_node(b)
        median, _ = rtt(net, src, dst, count=UNDERLAY_PING_COUNT)
        rate = throughput(net, src, dst, seconds=UNDERLAY_IPERF_S)
        out[f"{a}-{b}"] = {"rtt_ms": round(median, 3), "rate_mbit": round(rate, 1)}
    return out
