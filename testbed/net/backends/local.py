"""What the backends that build on this machine (netns, Mininet) share: the shaper is chosen
from this kernel's abilities and runs in the network's own router namespaces."""
from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path

from testbed.net.backends.base import Backend
from testbed.net.network import Network
from testbed.net.ledger import Ledger, new_tag
from testbed.net.shaping.interface import Shaper
from testbed.net.shaping.shapers import SHAPERS, choose_shaper
from testbed.topology import MAX_EMULATED_HOSTS_PER_DC, ResolvedLink, Topology

log = logging.getLogger(__name__)


class LocalBackend(Backend):
    """A backend whose networks live in this machine's kernel: its hosts are namespaces here,
    their traces files here."""

    hosts_here = True
    traces_live = True
    max_hosts_per_dc = MAX_EMULATED_HOSTS_PER_DC

    def shaper_choice(self, requested: str) -> tuple[str, str]:
        """``auto`` is netem where this kernel has it, else the delay line."""
        return choose_shaper(requested)

    def bring_up(self, topology: Topology, links: list[ResolvedLink], shaper: str,
                 workdir: Path, stack: ExitStack) -> tuple[Network, Shaper]:
        """Build, shape and read back (see Backend.bring_up)."""
        net = self.build(topology, links, Ledger(new_tag()))
        stack.callback(net.teardown)
        log.info("network %s up (%s, tag %s): %d hosts", topology.name, self.name, net.tag,
                 len(net.hosts))
        sh = SHAPERS[shaper](net, workdir)
        stack.callback(sh.stop)
        sh.apply()
        return net, sh
