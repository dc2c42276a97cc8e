"""Build, shape and always tear down an emulated network, as one context manager."""
from __future__ import annotations

import logging
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

from testbed.net.backends import get_backend
from testbed.net.backends.base import Network
from testbed.net.ledger import Ledger, new_tag
from testbed.net.shaping.shapers import SHAPERS, Shaper
from testbed.net.topology import ResolvedLink, Topology

log = logging.getLogger(__name__)


def bring_up(topology: Topology, links: list[ResolvedLink], backend: str, shaper: str,
             workdir: Path, stack: ExitStack) -> tuple[Network, Shaper]:
    """Build the network and shape it; push the undo of each step on ``stack``.

    ``shaper`` is a concrete name (see ``choose_shaper``). Raises NetworkError/ShapingError
    after removing whatever was made."""
    net = get_backend(backend).build(topology, links, Ledger(new_tag()))
    stack.callback(net.teardown)
    log.info("network %s up (%s, tag %s): %d hosts", topology.name, backend, net.tag,
             len(net.hosts))
    sh = SHAPERS[shaper](net, workdir)
    stack.callback(sh.stop)
    sh.apply()
    return net, sh


@contextmanager
def emulated_network(topology: Topology, links: list[ResolvedLink] | None = None,
                     backend: str = "netns", shaper: str = "delayline",
                     workdir: Path = Path("/tmp")) -> Iterator[tuple[Network, Shaper]]:
    """The network up and shaped inside the ``with``; removed on the way out, whatever happens."""
    with ExitStack() as stack:
        yield bring_up(topology, links if links is not None else topology.resolved_links(),
                       backend, shaper, workdir, stack)
