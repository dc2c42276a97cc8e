"""How the controller reaches the machines of a ``backend: cluster`` network: ``Machines`` is
what the backend asks of them, whatever carries it; ``SshMachines`` reaches the machines of an
inventory over SSH (as the lab backend does). ``testbed.net.cluster.slurmnet`` takes them from
a Slurm allocation and starts every per-machine part with ``srun``.
"""
from __future__ import annotations

import ipaddress
from abc import ABC, abstractmethod
from pathlib import Path, PurePosixPath

from testbed.errors import MachineError
from testbed.net.cluster.network import Agent, AgentOutput, ClusterNetwork
from testbed.net.cluster.placement import Machine
from testbed.net.cluster.underlay import probe_capacity
from testbed.net.lab import ssh
from testbed.net.lab.inventory import load_inventory
from testbed.net.lab.lab import Lab
from testbed.net.lab.process import RemoteProcess
from testbed.net.ledger import Ledger
from testbed.net.network import Network
from testbed.topology import ResolvedLink, Topology

MACHINES_GROUP = "machines"


class Machines(ABC):
    """The machines of one cluster network and how their parts are started."""

    @abstractmethod
    def open(self) -> None:
        """Reach every machine and learn what it offers; raises MachineError or RemoteError."""

    @abstractmethod
    def close(self) -> None:
        """Let go of the machines; idempotent."""

    @abstractmethod
    def planned_capacities(self) -> list[Machine]:
        """What each machine offers as far as is known without reaching it (for ``plan``)."""

    @abstractmethod
    def capacities(self) -> list[Machine]:
        """What each machine offers (after ``open``)."""

    @abstractmethod
    def underlay(self, machine: str) -> tuple[ipaddress.IPv4Address, str]:
        """The address and NIC the other machines reach ``machine`` on."""

    @abstractmethod
    def netem_everywhere(self) -> bool:
        """Whether every machine's kernel has sch_netem."""

    @abstractmethod
    def network(self, topology: Topology, links: list[ResolvedLink], ledger: Ledger,
                backend, files: Path) -> Network:
        """An empty network whose nodes will be namespaces on these machines; ``files`` is
        where its files go on this machine (the machines see them elsewhere or the same)."""

    @abstractmethod
    def put_share(self, net: Network, machine: str, text: str) -> str:
        """Write a share where ``machine`` reads it; returns that path there."""

    @abstractmethod
    def start_agent(self, net: Network, machine: str, argv: list[str]) -> Agent:
        """Start ``argv`` (the machine's agent) on ``machine`` as root, its input open."""

    @abstractmethod
    def finish(self, net: Network, machine: str) -> None:
        """Remove what the network left in ``machine``'s run directory."""

    @abstractmethod
    def ledger_entry(self, net: Network) -> dict:
        """How ``clean`` reaches these machines again and what ``net`` left there besides its
        shares (``testbed.net.cluster.clean``)."""

    @abstractmethod
    def clock_report(self) -> dict:
        """Each machine's clock offset from the controller's, as measured."""


class SshMachines(Machines):
    """The group ``[machines]`` of an Ansible inventory, reached over SSH as root."""

    def __init__(self, inventory: Path, known_hosts: Path, workdir: str,
                 connect_timeout_s: float, clock_samples: int):
        self.inventory, self.known_hosts, self.workdir = inventory, known_hosts, workdir
        self.connect_timeout_s, self.clock_samples = connect_timeout_s, clock_samples
        self.lab: Lab | None = None
        self._capacities: list[Machine] = []

    def open(self) -> None:
        """Connect (host keys checked, versions compared, clocks measured), refuse logins
        other than root, and read what each machine offers (the inventory's
        ``testbed_cores``/``testbed_memory_gb``/``testbed_gpus``, else probed)."""
        if self.lab is not None:
            return
        self.lab = Lab.open(self.inventory, [MACHINES_GROUP], self.known_hosts,
                            self.connect_timeout_s, self.clock_samples)
        try:
            users = [h.name for h in self.lab.hosts() if h.user != "root"]
            if users:
                raise MachineError(f"machines {', '.join(users)} are not logged in as root",
                                   "set ansible_user=root: each machine builds namespaces")
            self._capacities = probe_capacity(self.lab)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.lab is not None:
            self.lab.close()
            self.lab = None

    def planned_capacities(self) -> list[Machine]:
        inv = load_inventory(self.inventory, [MACHINES_GROUP])
        return [Machine(h.name, h.cores, h.memory_gb, h.gpus) for h in inv.hosts()]

    def capacities(self) -> list[Machine]:
        return self._capacities

    def underlay(self, machine: str) -> tuple[ipaddress.IPv4Address, str]:
        h = self.lab.host(machine)
        return h.ip, h.iface

    def netem_everywhere(self) -> bool:
        return all(self.lab.netem.values())

    def network(self, topology, links, ledger, backend, files) -> ClusterNetwork:
        return ClusterNetwork(topology=topology, links=links, ledger=ledger, backend=backend,
                              lab=self.lab, run_dir=f"{self.workdir.rstrip('/')}/{ledger.tag}")

    def put_share(self, net: ClusterNetwork, machine: str, text: str) -> str:
        host, conn = self.lab.host(machine), self.lab.conns[machine]
        ssh.run(conn, host, ["mkdir", "-p", "--", net.run_dir])
        path = str(PurePosixPath(net.run_dir) / f"share-{machine}.json")
        with net.sftp(host) as sftp, sftp.open(path, "w") as f:
            f.write(text.encode())
        return path

    def start_agent(self, net: ClusterNetwork, machine: str, argv: list[str]) -> Agent:
        host, out = self.lab.host(machine), AgentOutput()
        proc = RemoteProcess(self.lab.conns[machine], host, [host.python, *argv[1:]],
                             cwd=host.home, output=out)
        return Agent(proc, out, proc.close_stdin, proc.close)

    def finish(self, net: ClusterNetwork, machine: str) -> None:
        ssh.run(self.lab.conns[machine], self.lab.host(machine),
                ["rm", "-rf", "--", net.run_dir], check=False)

    def ledger_entry(self, net: ClusterNetwork) -> dict:
        return {"inventory": str(self.inventory), "known_hosts": str(self.known_hosts),
                "run_dir": net.run_dir}

    def clock_report(self) -> dict:
        return self.lab.clock_report()
