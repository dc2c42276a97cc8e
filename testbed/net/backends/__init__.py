"""Backends that realise a Topology behind one interface (``base.Backend``): ``netns``
(pyroute2 namespaces), ``mininet`` and ``remote`` (lab hosts over SSH)."""
from __future__ import annotations

import importlib
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

from testbed.errors import MachineError
from testbed.net.backends.base import Backend
from testbed.net.network import Network
from testbed.net.shaping.interface import Shaper
from testbed.topology import ResolvedLink, Topology

# name → (module, class); imported on use so that a missing optional package (mininet,
# fabric) only matters to experiments that ask for it.
BACKENDS: dict[str, tuple[str, str]] = {
    "netns": ("testbed.net.backends.netns", "NetnsBackend"),
    "mininet": ("testbed.net.backends.mininet", "MininetBackend"),
    "remote": ("testbed.remote.backend", "RemoteBackend"),
}


def get_backend(name: str, lab=None) -> Backend:
    """An instance of the named backend (``lab``: the remote backend's LabSettings, ignored by
    the others); raises MachineError if its packages are missing."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
    module, cls = BACKENDS[name]
    try:
        backend_cls = getattr(importlib.import_module(module), cls)
    except ImportError as e:
        raise MachineError(f"backend {name} needs {e.name}",
                           "run `bash setup.sh` (it installs every dependency)") from e
    return backend_cls(lab)


@contextmanager
def emulated_network(topology: Topology, links: list[ResolvedLink] | None = None,
                     backend: str = "netns", shaper: str = "delayline",
                     workdir: Path = Path("/tmp")) -> Iterator[tuple[Network, Shaper]]:
    """A network on this machine, up and shaped inside the ``with``; removed on the way out,
    whatever happens."""
    with ExitStack() as stack:
        b = get_backend(backend)
        yield b.bring_up(topology, links if links is not None else topology.resolved_links(),
                         shaper, workdir, stack)
