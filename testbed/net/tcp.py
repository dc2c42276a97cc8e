"""TCP settings every emulated host gets, whatever the machine's defaults are."""
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
