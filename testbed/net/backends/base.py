"""The one backend interface: netns, Mininet and lab hosts all turn a Topology into a shaped
``Network`` behind it, so the runner never asks which it has."""
from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import ExitStack
from pathlib import Path

from testbed.net.ledger import Ledger
from testbed.net.network import Network, Node
from testbed.net.shaping.interface import Shaper
from testbed.spec import Experiment
from testbed.topology import ResolvedLink, Topology


class Backend(ABC):
    """Turns topologies into shaped Networks. One interface for namespaces, Mininet and lab
    hosts: the runner never asks which it has. Use as a context manager: ``open`` connects to
    what the backend needs (lab hosts), ``close`` lets go of it."""

    name: str = "base"
    # What the parts above ask of a backend, instead of its name:
    # its hosts are network namespaces of this machine, so the workers' CPUs are this box's and
    # the pre-started interpreter can fork ranks into them;
    hosts_here: bool = False
    # a rank's trace can be read on this machine while the rank runs (``at_iteration`` steps
    # are timed from rank 0's growing trace).
    traces_live: bool = False
    # the most hosts it builds in one DC (None: no limit of its own, as a lab's real hosts)
    max_hosts_per_dc: int | None = None

    @classmethod
    def for_experiment(cls, exp: Experiment, base_dir: Path) -> "Backend":
        """This backend with the settings ``exp`` gives it (paths relative to ``base_dir``,
        the experiment file's directory)."""
        return cls()

    def __enter__(self) -> "Backend":
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        """Connect to and check what this backend runs on; raises MachineError or RemoteError."""

    def close(self) -> None:
        """Let go of what ``open`` connected to; idempotent."""

    @abstractmethod
    def shaper_choice(self, requested: str) -> tuple[str, str]:
        """(shaper name, reason) for ``requested`` (auto | netem | delayline) on this backend;
        raises MachineError when it cannot be had here."""

    @abstractmethod
    def bring_up(self, topology: Topology, links: list[ResolvedLink], shaper: str,
                 workdir: Path, stack: ExitStack) -> tuple[Network, Shaper]:
        """Build the network, shape it and read the shaping back; the undo of every step is
        pushed on ``stack``. ``workdir`` receives the network's own records. Raises
        NetworkError/ShapingError after removing whatever was made."""

    @abstractmethod
    def build(self, topology: Topology, links: list[ResolvedLink], ledger: Ledger) -> Network:
        """Realise ``topology`` (unshaped); on failure remove what was made and raise."""

    @abstractmethod
    def argv_in(self, node: Node, argv: list[str]) -> list[str]:
        """``argv`` wrapped to run inside ``node``."""

    @abstractmethod
    def teardown(self, net: Network) -> None:
        """Remove everything ``net`` made; idempotent."""

    def netns_file(self, node: Node) -> str | None:
        """The file of ``node``'s network namespace on this machine (what setns(2) takes), or
        None where the node is not on this machine (lab hosts)."""
        return None

    def host_port(self, net: Network, dc: str, j: int) -> tuple[Node, str]:
        """The node and interface on the DC side of host j's link (for intra-DC shaping)."""
        raise NotImplementedError(f"backend {self.name} has no host ports")
