"""The ``cluster`` backend: one emulation spread over several machines reached over SSH.

Each machine of the experiment's ``cluster.inventory`` (group ``[machines]``) carries whole DCs,
packed by what they need against what it offers (``testbed.net.cluster.placement``). On each
machine an agent (``clusteragent``, started over SSH as root) builds its DCs as the netns
backend does on one box and holds them; a link between DCs on two machines is a VXLAN tunnel
between their underlay addresses, shaped on the emulated side exactly as on one box
(``clustershare``). The network handed back is a ``ClusterNetwork``; the shapers are the
namespace shapers, run in the router namespaces over SSH.

Teardown stops the network's processes and ends each agent's standard input: the agent removes
its share. When the controller dies, its SSH connections close and the agents do the same; the
controller's ledger lists every machine's tag, so ``clean`` finds what is left
(``testbed.net.cluster.clean``).
"""
from __future__ import annotations

import json
import logging
import sys
import time
import tempfile
from contextlib import ExitStack
from pathlib import Path

from testbed.errors import MachineError, NetworkError, writing
from testbed.net.backends.base import Backend
from testbed.net.backends.clustershare import Share, Underlay
from testbed.net.backends.netns import BRIDGE, HOST_IFACE, host_ns, link_iface, router_ns
from testbed.net.cluster import placement as packing
from testbed.net.cluster.machines import Machines, SshMachines
from testbed.net.cluster.slurmnet import SlurmMachines
from testbed.net.cluster.underlay import measure_underlay
from testbed.net.lab.lab import resolve_path
from testbed.net.ledger import Ledger, new_tag
from testbed.net.network import LinkEnd, Network, Node
from testbed.net.shaping.interface import Shaper
from testbed.net.shaping.shapers import SHAPERS, choose_shaper
from testbed.process import stop_processes
from testbed.spec import Experiment
from testbed.topology import MAX_EMULATED_HOSTS_PER_DC, ResolvedLink, Topology

log = logging.getLogger(__name__)

AGENT_READY_TIMEOUT_S = 120.0
AGENT_EXIT_TIMEOUT_S = 30.0
BUILD_FAILED = 1  # the agent's exit status when its build failed (it removed what it made)


class ClusterBackend(Backend):
    """See the module docstring. ``open`` reaches the machines and learns what they offer."""

    name = "cluster"  # workers run on the machines: hosts_here and traces_live stay False
    max_hosts_per_dc = MAX_EMULATED_HOSTS_PER_DC

    def __init__(self, exp: Experiment | None = None, base_dir: Path = Path(".")):
        self.exp, self.base_dir = exp, base_dir
        self._machines: Machines | None = None
        self._opened = False
        self.files: Path | None = None  # where a network's files go here (bring_up's workdir)

    @classmethod
    def for_experiment(cls, exp: Experiment, base_dir: Path) -> "ClusterBackend":
        return cls(exp, base_dir)

    @property
    def settings(self):
        if self.exp is None or self.exp.cluster is None:
            raise MachineError("backend cluster needs its machines",
                               "give the experiment a cluster section: {inventory: "
                               "machines.ini} or {slurm: true}")
        return self.exp.cluster

    @property
    def machines(self) -> Machines:
        """The machines, over SSH (``cluster.inventory``) or from the Slurm allocation this
        runs in (``cluster.slurm``)."""
        if self._machines is None:
            c = self.settings
            if c.slurm:
                self._machines = SlurmMachines(c.clock_samples)
            else:
                self._machines = SshMachines(
                    resolve_path(c.inventory, self.base_dir),
                    resolve_path(c.known_hosts, self.base_dir), c.workdir,
                    c.connect_timeout_s, c.clock_samples)
        return self._machines

    def open(self) -> None:
        if not self._opened:
            self.machines.open()
            self._opened = True

    def close(self) -> None:
        if self._machines is not None:
            self._machines.close()
        self._opened = False

    def shaper_choice(self, requested: str) -> tuple[str, str]:
        """netem where every machine's kernel has it, else the delay line (as on one box)."""
        self.open()
        return choose_shaper(requested, netem_ok=self.machines.netem_everywhere())

    def planned(self, topology: Topology) -> list[str]:
        """Where ``topology``'s DCs will run, one line per machine, as far as is known without
        reaching the machines (capacities not given count as unlimited and show ``?``); raises
        SpecError for an unreadable inventory, MachineError when the DCs do not fit."""
        machines = self.machines.planned_capacities()
        if not machines:
            return ["the machines are the Slurm allocation's nodes: placed when run inside one "
                    "(salloc or sbatch)"]
        placed = self.place(topology, machines)
        return packing.describe(placed, self.needs(topology), machines)

    def needs(self, topology: Topology) -> list[packing.DcNeed]:
        """What each DC of ``topology`` needs of its machine."""
        w = self.exp.workload
        gpus = 1 if w.dist_backend == "nccl" else 0
        return [packing.DcNeed(dc.name, dc.hosts * w.ranks_per_host,
                               dc.hosts * w.ranks_per_host * self.settings.rank_memory_gb,
                               dc.hosts * w.ranks_per_host * gpus) for dc in topology.dcs]

    def place(self, topology: Topology, machines: list[packing.Machine]) -> dict[str, str]:
        """DC → machine (see testbed.net.cluster.placement); MachineError when they do not fit."""
        try:
            return packing.place_dcs(self.needs(topology), machines, self.settings.place)
        except packing.PlacementError as e:
            raise MachineError(f"the DCs do not fit the machines: {e}",
                               "add machines, or give their capacities or cluster.place") from e

    def bring_up(self, topology: Topology, links: list[ResolvedLink], shaper: str,
                 workdir: Path, stack: ExitStack) -> tuple[Network, Shaper]:
        """Build the shares, shape the links and read them back; ``workdir`` receives
        cluster.json (machines, placement, tunnels, underlay, clocks)."""
        self.open()
        self.files = workdir
        net = self.build(topology, links, Ledger(new_tag()))
        stack.callback(net.teardown)
        if self.settings.measure_underlay:
            net.spread.underlay = measure_underlay(net)
        with writing(workdir / "cluster.json"):
            workdir.mkdir(parents=True, exist_ok=True)
            (workdir / "cluster.json").write_text(json.dumps({
                "placed": net.spread.placed,
                "machines": [m.__dict__ for m in self.machines.capacities()],
                "tunnel_mtu": net.spread.tunnel_mtu, "underlay": net.spread.underlay,
                "clocks": self.machines.clock_report()}, indent=2))
        sh = SHAPERS[shaper](net, workdir)
        stack.callback(sh.stop)
        sh.apply()
        log.info("cluster network %s up (tag %s): %s; the machines' shares: %s", topology.name,
                 net.tag, net.row_notes()["cluster_machines"],
                 ", ".join(f"{m} tag {t}" for m, t in net.ledger.machines["tags"].items()))
        return net, sh

    def argv_in(self, node: Node, argv: list[str]) -> list[str]:
        return ["ssh", node.name, *argv]  # for messages; the network's own argv_in runs it

    def build(self, topology: Topology, links: list[ResolvedLink], ledger: Ledger) -> Network:
        """Place the DCs, start each machine's agent and wait until every share is built."""
        self.open()
        placed = self.place(topology, self.machines.capacities())
        files = self.files or Path(tempfile.mkdtemp(prefix="testbed-cluster-"))
        net = self.machines.network(topology, links, ledger, self, files)
        net.spread.placed = placed
        used = sorted(set(placed.values()))
        ledger.backend = self.name
        ledger.machines = {**self.machines.ledger_entry(net), "tags": {m: new_tag() for m in used}}
        ledger.save()
        try:
            self._start_agents(net, used)
            self._wait_ready(net)
        except BaseException:
            self.teardown(net)
            raise
        self._nodes(net)
        return net

    def _start_agents(self, net: Network, used: list[str]) -> None:
        tags = net.ledger.machines["tags"]
        underlay = {}
        for m in self.machines.capacities():
            addr, iface = self.machines.underlay(m.name)
            underlay[m.name] = Underlay(addr=addr, iface=iface)
        for m in used:
            share = Share(machine=m, tag=tags[m], vni_base=int(net.tag[2:], 16),
                          topology=net.topology, links=net.links, placed=net.spread.placed,
                          underlay=underlay)
            path = self.machines.put_share(net, m, share.model_dump_json())
            net.spread.agents[m] = self.machines.start_agent(
                net, m, [sys.executable, "-m", "testbed.net.backends.clusteragent", path])

    def _wait_ready(self, net: Network) -> None:
        deadline = time.monotonic() + AGENT_READY_TIMEOUT_S
        waiting = dict(net.spread.agents)
        while waiting:
            for m, agent in list(waiting.items()):
                text = agent.output.text()
                ready = next((ln for ln in text.splitlines() if ln.startswith("READY ")), None)
                if ready is not None:
                    net.spread.tunnel_mtu.update(json.loads(ready[6:])["tunnel_mtu"])
                    del waiting[m]
                elif agent.proc.poll() is not None:
                    raise NetworkError(f"machine {m} could not build its share "
                                       f"({agent.proc.returncode}): {text.strip()[-800:]}")
            if waiting and time.monotonic() > deadline:
                raise NetworkError(f"machines {', '.join(waiting)} did not build their shares "
                                   f"within {AGENT_READY_TIMEOUT_S:g} s")
            time.sleep(0.05)

    def _nodes(self, net: Network) -> None:
        """The network's nodes and link ends, named as each machine's agent named them."""
        topo, tags, spread = net.topology, net.ledger.machines["tags"], net.spread
        for dc in topo.dcs:
            m = spread.placed[dc.name]
            rns = router_ns(tags[m], dc.name)
            net.routers[dc.name] = Node(f"{dc.name}-router", dc.name, rns,
                                        topo.router_ip(dc.name), BRIDGE)
            spread.machine_of[rns] = m
            for j in range(dc.hosts):
                ns = host_ns(tags[m], dc.name, j)
                net.hosts[(dc.name, j)] = Node(f"{dc.name}-{j}", dc.name, ns,
                                               topo.host_ip(dc.name, j), HOST_IFACE, j)
                spread.machine_of[ns] = m
        for link in net.links:
            ip_a, ip_b = list(link.transit.hosts())[:2]
            net.link_ends.append(LinkEnd(link, net.routers[link.a], link_iface(link.b), link.b,
                                         ip_b))
            net.link_ends.append(LinkEnd(link, net.routers[link.b], link_iface(link.a), link.a,
                                         ip_a))

    def host_port(self, net: Network, dc: str, j: int) -> tuple[Node, str]:
        return net.routers[dc], f"h{j}"

    def teardown(self, net: Network) -> None:
        """Stop the network's processes, end every agent's input (each removes its share)
        and remove the run directories; idempotent. What a machine could not remove is logged
        and stays in the ledger for ``clean``."""
        stop_processes(net.procs)
        for p in net.procs:
            p.close()
        net.procs.clear()
        net.close_connections()
        agents = net.spread.agents
        for agent in agents.values():
            if agent.proc.poll() is None:
                agent.end_input()
        failed = []
        deadline = time.monotonic() + AGENT_EXIT_TIMEOUT_S
        for m, agent in agents.items():
            try:
                agent.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - a machine that went away must not stop the rest
                stop_processes([agent.proc])
            if agent.proc.returncode not in (0, BUILD_FAILED):  # 1: it removed what it made
                failed.append(f"{m}: {agent.output.text().strip()[-300:]}")
            agent.close()
        agents.clear()
        for m in sorted(set(net.spread.placed.values())):
            try:
                self.machines.finish(net, m)
            except Exception as e:  # noqa: BLE001
                failed.append(f"{m}: {e}")
        if failed:
            log.warning("cluster teardown of %s: %s", net.tag, "; ".join(failed))
            return  # the ledger stays: clean finds the machines
        net.ledger.remove_file()
