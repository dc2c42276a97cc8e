"""Whether a host's interface towards the other DCs carries RDMA: InfiniBand, or an Ethernet
NIC with RDMA over Converged Ethernet (RoCE). NCCL's traffic over RDMA never passes the
kernel's qdiscs, so tc (every shaper of testbed) cannot shape it (issue 31).

Read from sysfs, by a shell command that runs on this machine or on a lab host over SSH:

- ``<sysfs>/class/net/<if>/type`` is 32 (ARPHRD_INFINIBAND) for an InfiniBand interface
  (IPoIB);
- ``<sysfs>/class/net/<if>/device/infiniband/`` holds an RDMA device (``mlx5_0``…) for an
  Ethernet NIC whose driver registered one with the RDMA core (RoCE, also iWARP).

A veth, a bridge or loopback has neither. The sysfs root is a parameter so that a test can
point the probe at a fabricated tree.
"""
from __future__ import annotations

SYSFS = "/sys"
INFINIBAND, ROCE = "InfiniBand", "RoCE"
ARPHRD_INFINIBAND = 32  # include/uapi/linux/if_arp.h
_SCRIPT = ('d="$1/class/net/$2"; '
           f'if [ "$(cat "$d/type" 2>/dev/null)" = {ARPHRD_INFINIBAND} ]; then echo {INFINIBAND}; '
           f'elif [ -n "$(ls -A "$d/device/infiniband" 2>/dev/null)" ]; then echo {ROCE}; '
           'else echo none; fi')


def rdma_probe(iface: str, sysfs: str = SYSFS) -> list[str]:
    """A command printing ``InfiniBand``, ``RoCE`` or ``none`` for ``iface`` under ``sysfs``
    (an interface that does not exist is ``none``)."""
    return ["sh", "-c", _SCRIPT, "rdma-probe", sysfs, iface]


def parse_rdma(stdout: str) -> str | None:
    """The kind ``rdma_probe`` printed (InfiniBand or RoCE); None for none."""
    words = stdout.split()
    kind = words[-1] if words else "none"
    return kind if kind in (INFINIBAND, ROCE) else None
