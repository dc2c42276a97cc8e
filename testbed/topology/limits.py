"""What one machine can build of a topology: prediction (``plan``, ``simulate``) takes DCs of
up to ``MAX_PREDICTED_HOSTS`` hosts; ``run`` refuses, before building anything, what its
backend cannot build (``Backend.max_hosts_per_dc``)."""
from __future__ import annotations

from testbed.topology.topology import Topology

# The namespace backends build at most this many hosts per DC (the size they were built and
# measured for).
MAX_EMULATED_HOSTS_PER_DC = 64


def emulation_problems(topo: Topology, max_hosts_per_dc: int | None) -> list[str]:
    """Why ``run`` cannot build ``topo`` where a DC holds at most ``max_hosts_per_dc`` hosts
    (None: no limit of the backend's own); empty if it can."""
    out = []
    for dc in topo.dcs:
        if max_hosts_per_dc is not None and dc.hosts > max_hosts_per_dc:
            out.append(f"DC {dc.name} has {dc.hosts} hosts: this backend builds at most "
                       f"{max_hosts_per_dc} per DC (plan and simulate take it)")
        elif not topo.fits_subnet(dc):
            subnet = topo.subnet(dc.name)
            out.append(f"DC {dc.name} has {dc.hosts} hosts: its subnet {subnet} holds "
                       f"{subnet.num_addresses - 11} (hosts start at .10); give it a larger "
                       "subnet")
        if dc.intra_host is not None:
            out.append(f"DC {dc.name} sets intra_host, which only the simulator models: "
                       "ranks of one emulated host talk over its loopback, unshaped")
    return out
