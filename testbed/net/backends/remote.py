"""The ``remote`` backend: a topology realised by real lab hosts reached over SSH.

The experiment's ``remote.inventory`` names the hosts (one Ansible group per DC; see
``testbed.net.lab.inventory``). DC ``d``'s host j of the topology is the j-th host of group
``[d]``; its address and interface come from the inventory (the topology's subnets are not used:
the lab's addressing is what it is). Nothing is built: the network exists. What a cell adds,
and teardown removes on every host (also after a failure), is:

- a run directory ``<remote.workdir>/<tag>`` holding cell.json and the workers' traces;
- the tc shaping on each host's NIC (``testbed.net.lab.shaping``);
- the processes started through ``popen``/``start`` (killed by pid).

Each is written into the ledger's ``lab`` record as it is made, so that ``clean`` removes them
over SSH after a SIGKILL of the controller (``testbed.net.lab.clean``).

The network it hands back is a ``testbed.net.lab.network.RemoteNetwork``: commands, files and
processes on the lab hosts go over SSH.
"""
from __future__ import annotations

import json
import logging
import subprocess
from contextlib import ExitStack
from pathlib import Path

from testbed.errors import MachineError, ShapingError, writing
from testbed.net.backends.base import Backend
from testbed.net.lab import ssh
from testbed.net.lab.lab import Lab, LabSettings
from testbed.net.lab.network import RemoteNetwork
from testbed.net.lab.nic import Route, minor, shaped
from testbed.net.lab.shaping import HostShaping, RemoteShaper
from testbed.net.ledger import Ledger, new_tag
from testbed.net.network import Network, Node
from testbed.process import STOP_GRACE_S
from testbed.spec import Experiment
from testbed.topology import ResolvedLink, Topology

log = logging.getLogger(__name__)


class RemoteBackend(Backend):
    """Realises a topology on lab hosts: ``open`` connects to and checks the lab."""

    name = "remote"  # workers run on lab hosts: hosts_here and traces_live stay False

    def __init__(self, settings: LabSettings | None = None, lab: Lab | None = None):
        self.settings, self.lab = settings, lab
        self.workdir = settings.workdir if settings else "/tmp"

    @classmethod
    def for_experiment(cls, exp: Experiment, base_dir: Path) -> "RemoteBackend":
        """The lab that ``exp``'s ``remote`` section names (none without it: ``open`` then
        says what is missing)."""
        return cls(LabSettings.of(exp, base_dir) if exp.remote is not None else None)

    def open(self) -> None:
        """Connect to every host of the lab and check it (versions, clocks, netem)."""
        if self.lab is None:
            if self.settings is None:
                raise MachineError("backend remote needs the lab's hosts",
                                   "give the experiment a remote: {inventory: …} section")
            self.lab = self.settings.open()

    def close(self) -> None:
        if self.lab is not None and self.settings is not None:
            self.lab.close()
            self.lab = None

    def shaper_choice(self, requested: str) -> tuple[str, str]:
        """netem where every lab host has it, else rate-only htb (see Lab.shaper_choice)."""
        self.open()
        return self.lab.shaper_choice(requested)

    def bring_up(self, topology: Topology, links: list[ResolvedLink], shaper: str,
                 workdir: Path, stack: ExitStack) -> tuple[RemoteNetwork, RemoteShaper]:
        """Map the topology onto the lab, shape it and read the shaping back; ``workdir``
        receives lab.json (versions, clock offsets, netem per host)."""
        self.open()
        return bring_up(self, topology, links, shaper, workdir, stack)

    def argv_in(self, node: Node, argv: list[str]) -> list[str]:
        return ["ssh", node.name, *argv]

    def build(self, topology: Topology, links: list[ResolvedLink], ledger: Ledger) -> Network:
        """Map the topology onto the inventory's hosts and make each host's run directory."""
        if self.lab is None:
            raise MachineError("backend remote needs the lab's hosts",
                               "give the experiment a remote: {inventory: …} section")
        net = RemoteNetwork(topology=topology, links=links, ledger=ledger, backend=self,
                            lab=self.lab, run_dir=f"{self.workdir.rstrip('/')}/{ledger.tag}")
        ledger.backend = self.name
        if self.settings is not None:  # how ``clean`` reaches the hosts after a SIGKILL
            ledger.lab = {"inventory": str(self.settings.inventory),
                          "dcs": list(self.settings.dcs),
                          "known_hosts": str(self.settings.known_hosts), "run_dir": net.run_dir,
                          "shaped": {}, "processes": {}}
        ledger.save()
        for dc in topology.dcs:
            hosts = self.lab.inventory.dcs[dc.name]
            if len(hosts) < dc.hosts:
                ledger.remove_file()
                raise MachineError(f"DC {dc.name} needs {dc.hosts} hosts; the inventory's group "
                                   f"[{dc.name}] has {len(hosts)}", "add hosts to the group")
            for h in hosts[:dc.hosts]:
                net.hosts[(dc.name, h.index)] = Node(name=h.name, dc=dc.name, ns=h.name,
                                                     ip=h.ip, iface=h.iface, index=h.index)
        used = [self.lab.host(n.name) for n in net.hosts.values()]
        try:
            self.lab.each(lambda h, c: ssh.run(c, h, ["mkdir", "-p", "--", net.run_dir]),
                          "making the run directory", used)
        except BaseException:
            self.teardown(net)
            raise
        return net

    def host_port(self, net: Network, dc: str, j: int) -> tuple[Node, str]:
        raise ShapingError("backend remote shapes inter-DC traffic only (no intra-DC links)")

    def teardown(self, net: Network) -> None:
        """Stop the network's processes, remove its run directory on every host; idempotent.
        Failures are logged (a host that went away must not hide the others' cleanup)."""
        for p in net.procs:
            p.terminate()
        for p in net.procs:
            try:
                p.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                p.kill()
            p.close()
        net.procs.clear()
        net.close_connections()
        used = [self.lab.host(n.name) for n in net.hosts.values()]
        try:
            self.lab.each(lambda h, c: ssh.run(c, h, ["rm", "-rf", "--", net.run_dir],
                                               check=False), "removing the run directory", used)
        except ssh.RemoteError as e:
            log.warning("%s", e)
        net.ledger.remove_file()


def shaping_plan(net: RemoteNetwork) -> list[HostShaping]:
    """What each used host's NIC gets: one Route per inter-DC link its DC is on. Raises
    ShapingError for what the lab cannot express (intra-DC profiles, DC pairs without a link
    whose traffic would go unshaped, DCs sharing a subnet)."""
    topo, inv = net.topology, net.lab.inventory
    bad = [dc.name for dc in topo.dcs if shaped(dc.intra)]
    if bad:
        raise ShapingError(f"intra-DC profiles (DCs {', '.join(bad)}) are not emulated on lab "
                           "hosts: the lab's own DC network is what it is")
    linked = {frozenset((lk.a, lk.b)) for lk in net.links}
    names = [dc.name for dc in topo.dcs]
    missing = [f"{a}-{b}" for i, a in enumerate(names) for b in names[i + 1:]
               if frozenset((a, b)) not in linked]
    if missing and any(shaped(p) for lk in net.links for p in (lk.a_to_b, lk.b_to_a)):
        raise ShapingError(f"DC pairs {', '.join(missing)} have no link: on lab hosts every DC "
                           "reaches every other directly, so list a link for each pair")
    plan = []
    for node in net.hosts.values():
        host, routes = net.lab.host(node.name), []
        for lk in net.links:
            if node.dc not in (lk.a, lk.b):
                continue
            peer = lk.b if node.dc == lk.a else lk.a
            clash = [s for s in inv.subnets(peer) if s.overlaps(host.subnet)]
            if clash:
                raise ShapingError(f"{host.name} ({host.addr}) shares subnet {clash[0]} with DC "
                                   f"{peer}: tc cannot tell the DCs' traffic apart; give each "
                                   "DC its own subnet in testbed_addr")
            routes.append(Route(peer, minor(topo.dc_index(peer)), inv.subnets(peer),
                                lk.a_to_b if node.dc == lk.a else lk.b_to_a))
        plan.append(HostShaping(host, routes))
    return plan


def _record_shaped(net: RemoteNetwork, host: str, iface: str) -> None:
    if net.ledger.lab:
        net.ledger.lab["shaped"][host] = iface
        net.ledger.save()


def bring_up(backend: RemoteBackend, topology: Topology, links: list[ResolvedLink],
             shaper: str, record_dir: Path, stack: ExitStack) -> tuple[RemoteNetwork,
                                                                       RemoteShaper]:
    """Map the topology onto the lab, shape it and read the shaping back; every undo is pushed
    on ``stack``. ``record_dir`` receives lab.json (versions, clock offsets, netem, GPUs and
    RDMA per host)."""
    lab = backend.lab
    net = backend.build(topology, links, Ledger(new_tag()))
    stack.callback(net.teardown)
    with writing(record_dir / "lab.json"):
        record_dir.mkdir(parents=True, exist_ok=True)
        (record_dir / "lab.json").write_text(json.dumps(
            {"versions": lab.versions, "clocks": lab.clock_report(), "netem": lab.netem,
             "gpus": lab.gpus, "rdma": lab.rdma,
             "hosts": {n.name: {"dc": n.dc, "addr": str(lab.host(n.name).addr),
                                "iface": n.iface} for n in net.hosts.values()}}, indent=2))
    sh = RemoteShaper(lab, shaping_plan(net), name=shaper, lab_links=links,
                      on_shaped=lambda host, iface: _record_shaped(net, host, iface))
    stack.callback(sh.stop)
    sh.apply()
    log.info("lab network %s up (tag %s): %d hosts, shaper %s", topology.name, net.tag,
             len(net.hosts), shaper)
    return net, sh
