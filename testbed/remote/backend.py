"""The ``remote`` backend: a topology realised by real lab hosts reached over SSH.

The experiment's ``remote.inventory`` names the hosts (one Ansible group per DC; see
``testbed.remote.inventory``). DC ``d``'s host j of the topology is the j-th host of group
``[d]``; its address and interface come from the inventory (the topology's subnets are not used:
the lab's addressing is what it is). Nothing is built: the network exists. What a cell adds,
and teardown removes on every host (also after a failure), is:

- a run directory ``<remote.workdir>/<tag>`` holding cell.json and the workers' traces;
- the tc shaping on each host's NIC (``testbed.remote.shaping``);
- the processes started through ``popen``/``start`` (killed by pid).

Commands run as argument lists quoted into the remote shell; an argv that starts with this
interpreter (``sys.executable``) runs with the host's ``testbed_python`` instead.
"""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path, PurePath, PurePosixPath
from typing import IO

from testbed.errors import MachineError, ShapingError
from testbed.process import STOP_GRACE_S
from testbed.net.backends.base import Backend
from testbed.net.network import RUN_TIMEOUT_S, Network, Node
from testbed.net.ledger import Ledger, new_tag
from testbed.topology import ResolvedLink, Topology
from testbed.remote import ssh
from testbed.remote.inventory import LabHost
from testbed.remote.lab import Lab, LabSettings
from testbed.remote.process import RemoteProcess
from testbed.remote.shaping import HostShaping, RemoteShaper, Route, minor, shaped

log = logging.getLogger(__name__)

TIME_FIELDS = ("t", "t0", "t1")
TRACE_SUFFIX = ".jsonl"   # outputs in the trace format: their times move onto this clock


def align_trace(text: str, offset_ns: int, uncertainty_ns: int) -> str:
    """A worker's trace with its monotonic times moved onto the controller's clock (minus the
    host's offset); the meta record notes the offset and its uncertainty."""
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            out.append(line)  # a torn last line stays as it was (readers skip it)
            continue
        for k in TIME_FIELDS:
            if isinstance(rec.get(k), int):
                rec[k] -= offset_ns
        if rec.get("type") == "meta":
            rec.update(clock_offset_ns=offset_ns, clock_offset_uncertainty_ns=uncertainty_ns)
        out.append(json.dumps(rec))
    return "".join(line + "\n" for line in out)


@dataclass
class RemoteNetwork(Network):
    """A Network whose nodes are lab hosts; ``run`` and ``popen`` go over SSH."""

    lab: Lab | None = None
    run_dir: str = ""
    procs: list[RemoteProcess] = field(default_factory=list)

    def lab_host(self, node: Node) -> LabHost:
        return self.lab.host(node.name)

    def _argv(self, host: LabHost, argv: list[str]) -> list[str]:
        return [host.python, *argv[1:]] if argv and argv[0] == sys.executable else list(argv)

    def argv_in(self, node: Node, argv: list[str]) -> list[str]:
        return ["ssh", node.name, *self._argv(self.lab_host(node), argv)]  # for messages only

    def run(self, node: Node, argv: list[str], timeout: float = RUN_TIMEOUT_S,
            check: bool = True) -> subprocess.CompletedProcess:
        """Run ``argv`` on the node's host and wait; CommandError on failure when ``check``."""
        host = self.lab_host(node)
        r = ssh.run(self.lab.conns[host.name], host, self._argv(host, argv), timeout=timeout,
                    check=check)
        return subprocess.CompletedProcess(argv, r.returncode, r.stdout, r.stderr)

    def popen(self, node: Node, argv: list[str], stdout=None, stderr=None) -> RemoteProcess:
        """Start ``argv`` on the node's host; its output (stdout and stderr together) goes to
        ``stdout`` when that is a file. Stopped by teardown."""
        host = self.lab_host(node)
        out = stdout if hasattr(stdout, "write") else None
        proc = RemoteProcess(self.lab.conns[host.name], host, self._argv(host, argv),
                             cwd=host.home, output=out)
        self.procs.append(proc)
        return proc

    def gpu_count(self, node: Node) -> int:
        """The GPUs the node's host reported when the lab was opened."""
        return self.lab.gpus.get(node.name, 0)

    def files_dir(self, node: Node, local_dir: Path) -> PurePath:
        """The run directory on the node's host (one per network, made by ``build``; the
        ranks of one host share it: their files are named by rank)."""
        return PurePosixPath(self.run_dir)

    def put(self, node: Node, local: Path, there: PurePath) -> None:
        """Copy a file to the node's host over SFTP."""
        self.lab.conns[self.lab_host(node).name].sftp().put(str(local), str(there))

    def start(self, node: Node, argv: list[str], env: dict[str, str], log_file: IO[bytes],
              outputs: list[tuple[PurePath, Path]] = (),
              cwd: PurePath | None = None) -> RemoteProcess:
        """Start ``argv`` on the node's host with ``env``, stream its output into ``log_file``;
        when it exits, ``outputs`` are fetched over SFTP (traces moved onto this clock)."""
        host = self.lab_host(node)
        proc = RemoteProcess(self.lab.conns[host.name], host, self._argv(host, argv),
                             cwd=str(cwd) if cwd else host.home, env=env, output=log_file,
                             on_exit=lambda p: self.fetch(host, outputs))
        self.procs.append(proc)
        return proc

    def fetch(self, host: LabHost, outputs: list[tuple[PurePath, Path]]) -> None:
        """Copy each (file there, file here) from the host; trace files (JSONL) are aligned to
        the controller's clock with the host's measured offset. Files that were not written
        are skipped."""
        off = self.lab.offsets.get(host.name)
        for there, here in outputs:
            try:
                with self.lab.conns[host.name].sftp().open(str(there), "r") as f:
                    text = f.read().decode("utf-8", errors="replace")
            except FileNotFoundError:  # a program that writes no trace (not instrumented)
                continue
            if there.suffix == TRACE_SUFFIX:
                text = align_trace(text, off.monotonic_offset_ns if off else 0,
                                   off.uncertainty_ns if off else 0)
            Path(here).write_text(text, encoding="utf-8")


class RemoteBackend(Backend):
    """Realises a topology on lab hosts: ``open`` connects to and checks the lab."""

    name = "remote"

    def __init__(self, settings: LabSettings | None = None, lab: Lab | None = None):
        self.settings, self.lab = settings, lab
        self.workdir = settings.workdir if settings else "/tmp"

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


def bring_up(backend: RemoteBackend, topology: Topology, links: list[ResolvedLink],
             shaper: str, record_dir: Path, stack: ExitStack) -> tuple[RemoteNetwork,
                                                                       RemoteShaper]:
    """Map the topology onto the lab, shape it and read the shaping back; every undo is pushed
    on ``stack``. ``record_dir`` receives lab.json (versions, clock offsets, netem per host)."""
    lab = backend.lab
    net = backend.build(topology, links, Ledger(new_tag()))
    stack.callback(net.teardown)
    record_dir.mkdir(parents=True, exist_ok=True)
    (record_dir / "lab.json").write_text(json.dumps(
        {"versions": lab.versions, "clocks": lab.clock_report(), "netem": lab.netem,
         "gpus": lab.gpus,
         "hosts": {n.name: {"dc": n.dc, "addr": str(lab.host(n.name).addr),
                            "iface": n.iface} for n in net.hosts.values()}}, indent=2))
    sh = RemoteShaper(lab, shaping_plan(net), name=shaper, lab_links=links)
    stack.callback(sh.stop)
    sh.apply()
    log.info("lab network %s up (tag %s): %d hosts, shaper %s", topology.name, net.tag,
             len(net.hosts), shaper)
    return net, sh
