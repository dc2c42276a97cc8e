"""TCP settings every emulated host gets, whatever the machine's defaults are, and the root
namespace limits an emulated network of many hosts needs."""
from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from testbed.errors import MachineError
from testbed.topology import Topology

log = logging.getLogger(__name__)
PROC = Path("/proc/sys/net/ipv4")


def host_sysctls(topo: Topology) -> dict[str, str]:
    """The sysctls of each host namespace: socket buffer limits, congestion control, and no
    slow start after idle (pipeline transfers come in bursts with idle gaps above the RTO;
    ansible's nettune role sets the same on lab hosts)."""
    buf = str(int(topo.tcp_buffer_max_mb * (1 << 20)))
    return {"net.ipv4.tcp_rmem": f"4096 131072 {buf}",
            "net.ipv4.tcp_wmem": f"4096 16384 {buf}",
            "net.ipv4.tcp_slow_start_after_idle": "0",
            "net.ipv4.tcp_congestion_control": topo.tcp_congestion_control}


def allow_congestion_control(name: str) -> None:
    """Make ``name`` settable inside network namespaces (call in the root namespace).

    Linux lets a child namespace choose as its default only the algorithms in the root's
    ``tcp_allowed_congestion_control`` (this project's CI machines allow only reno and bbr).
    Appending one widens what unprivileged sockets may pick and changes nothing else; it is
    logged and left in place (other namespaces may rely on it)."""
    allowed_path = PROC / "tcp_allowed_congestion_control"
    allowed = allowed_path.read_text().split()
    if name in allowed:
        return
    if name not in (PROC / "tcp_available_congestion_control").read_text().split():
        subprocess.run(["modprobe", f"tcp_{name}"], capture_output=True, check=False)
        if name not in (PROC / "tcp_available_congestion_control").read_text().split():
            raise MachineError(f"TCP congestion control {name!r} is not available in this "
                               "kernel", f"choose another with topology.tcp_congestion_control")
    allowed_path.write_text(" ".join([*allowed, name]))
    log.info("added %s to net.ipv4.tcp_allowed_congestion_control (was: %s)", name,
             " ".join(allowed))


NEIGH = Path("/proc/sys/net/ipv4/neigh/default")
# Linux keeps the ARP entries of every network namespace in one table whose hard limit
# (gc_thresh3, 1024 by default) counts them all: 64 hosts in 4 DCs already need ~1,100, and a
# full table makes new neighbours fail ("No route to host") in every namespace of the machine.
NEIGH_HEADROOM = 2      # room for other networks on the same machine
NEIGH_MIN_EXTRA = 1024


def neighbour_entries(topo: Topology) -> int:
    """ARP entries a built topology needs: every host knows its DC's hosts and router; every
    router its hosts and the routers it links to."""
    hosts = [dc.hosts for dc in topo.dcs]
    return sum(h * h for h in hosts) + sum(hosts) + 2 * len(topo.resolved_links())


def make_room_for_neighbours(topo: Topology) -> None:
    """Raise the machine's ARP table limits (root namespace) when ``topo`` would not fit with
    room to spare; never lowers them. Logged and left in place, like the congestion control."""
    want = NEIGH_HEADROOM * neighbour_entries(topo) + NEIGH_MIN_EXTRA
    if not (NEIGH / "gc_thresh3").exists():
        # only the initial namespace shows the machine-wide limits: a builder inside another
        # (a stand-in machine of backend cluster) cannot change them, and leaves them be
        log.info("ARP limits not visible from this namespace; left as they are")
        return
    limits = {name: int((NEIGH / name).read_text()) for name in ("gc_thresh2", "gc_thresh3")}
    if limits["gc_thresh3"] >= want:
        return
    new = {"gc_thresh2": max(limits["gc_thresh2"], want // 2), "gc_thresh3": want}
    for name, value in new.items():
        (NEIGH / name).write_text(str(value))
    log.info("raised net.ipv4.neigh.default ARP limits for %d-host networks: %s (were %s)",
             sum(dc.hosts for dc in topo.dcs), new, limits)
