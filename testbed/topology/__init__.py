"""Topology data, pure (no kernel, no processes, no torch), validated as a whole before
anything is built:

- ``topology``: DCs, hosts, inter-DC links, addressing and routes;
- ``linkprofile``: what one direction of a link does (delay, jitter, loss, rate, queue) and
  the steps that change it during a run;
- ``slot``: where one rank runs (the placement's output).

Their names are importable from here: ``from testbed.topology import Topology, LinkProfile``.
"""
from testbed.topology.linkprofile import (DC_NAME_PATTERN, IFNAMSIZ, MAX_DC_NAME, MAX_DELAY_MS,
                                          TRANSIT_NET, GilbertElliott, LinkProfile, Step,
                                          Strict, step_order)
from testbed.topology.slot import Slot, local_world_sizes, single_host_placement
from testbed.topology.topology import DC, InterDCLink, ResolvedLink, Topology
from testbed.topology.limits import MAX_EMULATED_HOSTS_PER_DC, emulation_problems

__all__ = ["DC", "DC_NAME_PATTERN", "GilbertElliott", "IFNAMSIZ", "InterDCLink", "LinkProfile",
           "MAX_DC_NAME", "MAX_DELAY_MS", "MAX_EMULATED_HOSTS_PER_DC",
           "emulation_problems", "ResolvedLink", "Slot", "Step", "Strict",
           "TRANSIT_NET", "Topology", "local_world_sizes", "single_host_placement", "step_order"]
