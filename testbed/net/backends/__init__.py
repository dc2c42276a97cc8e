"""Backends that realise a Topology behind one interface (``base.Backend``): ``netns``
(pyroute2 namespaces), ``mininet`` and ``remote`` (lab hosts over SSH). Which one an experiment
names is looked up here, and only here; the parts above ask the backend what it can do
(``Backend.hosts_here``, ``Backend.traces_live``), never which it is."""
from __future__ import annotations

from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

from testbed.errors import MachineError
from testbed.net.backends.base import Backend
from testbed.net.network import Network
from testbed.net.shaping.interface import Shaper
from testbed.spec import Experiment
from testbed.topology import ResolvedLink, Topology

BACKENDS = ("netns", "mininet", "remote", "cluster")


def backend_class(name: str) -> type[Backend]:
    """The class of the named backend, imported on use so that a missing optional package
    (mininet) only matters to experiments that ask for it; raises MachineError if its
    packages are missing."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
    try:
        if name == "netns":
            from testbed.net.backends.netns import NetnsBackend
            return NetnsBackend
        if name == "mininet":
            from testbed.net.backends.mininet import MininetBackend
            return MininetBackend
        if name == "cluster":
            from testbed.net.backends.cluster import ClusterBackend
            return ClusterBackend
        from testbed.net.backends.remote import RemoteBackend
        return RemoteBackend
    except ImportError as e:
        raise MachineError(f"backend {name} needs {e.name}",
                           "run `bash setup.sh` (it installs every dependency)") from e


def get_backend(name: str) -> Backend:
    """An instance of the named backend with no settings of an experiment; raises
    MachineError if its packages are missing."""
    return backend_class(name)()


def experiment_backend(exp: Experiment, base_dir: Path) -> Backend:
    """The backend ``exp`` asks for, with its settings (paths relative to ``base_dir``, the
    experiment file's directory); raises MachineError if its packages are missing."""
    return backend_class(exp.backend).for_experiment(exp, base_dir)


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
