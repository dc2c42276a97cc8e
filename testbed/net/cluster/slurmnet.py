"""``backend: cluster`` inside a Slurm allocation: the machines are the job's nodes and every
per-node part (each machine's agent, the shapers' commands and delay lines, link probes, the
ranks) starts as a step of the job with ``srun`` (``testbed.net.cluster.slurm``).

Files are not copied: the directory a run writes to (its results) must be on a filesystem every
node shares, as Slurm clusters' home and project directories are; a node that cannot read its
share says so. Each node's CLOCK_MONOTONIC offset is measured once over one step's pipe (the
lab's echo loop, the fastest round trip kept), and a rank's trace is moved onto the
controller's clock when the rank exits, as a lab host's is when it is fetched.
"""
from __future__ import annotations

import ipaddress
import os
import select
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import IO, Any

from testbed.errors import MachineError, writing
from testbed.net.cluster import slurm
from testbed.net.cluster.machines import Machines
from testbed.net.cluster.network import Agent, AgentOutput, Spread, machine_node
from testbed.net.cluster.placement import Machine
from testbed.net.lab.clocks import ECHO_LOOP
from testbed.net.lab.lab import NETEM_PROBE
from testbed.net.lab.network import TRACE_SUFFIX, align_trace
from testbed.net.network import Network, Node

PROBE_TIMEOUT_S = 120.0
CLOCK_TIMEOUT_S = 60.0


def job_cpus(env=os.environ) -> list[int]:
    """CPUs the job holds on each of its nodes, in node-list order, from
    ``SLURM_JOB_CPUS_PER_NODE`` (``2(x3),1`` is 2, 2, 2, 1); empty when not set."""
    out: list[int] = []
    for part in filter(None, env.get("SLURM_JOB_CPUS_PER_NODE", "").split(",")):
        count, _, times = part.partition("(x")
        out += [int(count)] * (int(times.rstrip(")")) if times else 1)
    return out


@dataclass
class NodeClock:
    """A node's CLOCK_MONOTONIC relative to the controller's (ns; |error| ≤ rtt / 2)."""

    monotonic_offset_ns: int
    rtt_ns: int

    def as_dict(self) -> dict:
        return {"monotonic_offset_ns": self.monotonic_offset_ns, "rtt_ns": self.rtt_ns,
                "uncertainty_ns": self.rtt_ns // 2}


def measure_clock(node: str, samples: int) -> NodeClock:
    """The node's monotonic offset from the fastest of ``samples`` round trips over one step's
    pipe (the first answer, which waits for the interpreter, is dropped)."""
    proc = subprocess.Popen(slurm.srun_argv(node, [sys.executable, "-u", "-c", ECHO_LOOP]),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        best = None
        for k in range(samples + 1):
            t0 = time.monotonic_ns()
            proc.stdin.write(b"\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], CLOCK_TIMEOUT_S)
            if not ready:
                raise MachineError(f"node {node}: no clock answer within {CLOCK_TIMEOUT_S:g} s",
                                   "check that srun starts steps on it")
            line = proc.stdout.readline()
            t1 = time.monotonic_ns()
            if not line:
                raise MachineError(f"node {node}: the clock probe ended", "check srun on it")
            if k and (best is None or t1 - t0 < best.rtt_ns):
                best = NodeClock(int(line.split()[0]) - (t0 + t1) // 2, t1 - t0)
        return best
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class AlignedStep:
    """A step started with srun (a ``ProcessHandle``); when it has exited, the trace files it
    wrote are moved onto the controller's clock (once, before ``returncode`` is reported)."""

    def __init__(self, proc: subprocess.Popen, outputs: list[tuple[PurePath, Path]],
                 clock: NodeClock):
        self.proc, self.outputs, self.clock = proc, list(outputs), clock
        self.pid, self.returncode = proc.pid, None

    def poll(self) -> int | None:
        if self.returncode is None and self.proc.poll() is not None:
            for there, here in self.outputs:
                if PurePath(there).suffix == TRACE_SUFFIX and Path(there).exists():
                    text = Path(there).read_text(encoding="utf-8", errors="replace")
                    with writing(Path(here)):
                        Path(here).write_text(align_trace(
                            text, self.clock.monotonic_offset_ns, self.clock.rtt_ns // 2))
            self.returncode = self.proc.returncode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self.proc.wait(timeout=timeout)
        return self.poll()

    def terminate(self) -> None:
        self.proc.terminate()

    def kill(self) -> None:
        self.proc.kill()

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def close(self) -> None:
        pass


@dataclass
class SlurmNetwork(Network):
    """Nodes are namespaces on the allocation's nodes; every command a step of the job."""

    spread: Spread = field(default_factory=Spread)
    slurm_machines: Any = None
    files: Path | None = None
    procs: list = field(default_factory=list)

    def machine_node(self, machine: str) -> Node:
        addr, iface = self.slurm_machines.underlay(machine)
        return machine_node(machine, addr, iface)

    def argv_in(self, node: Node, argv: list[str]) -> list[str]:
        inner = ["ip", "netns", "exec", node.ns, *argv] if node.ns else list(argv)
        return slurm.srun_argv(self.spread.machine(node), inner)

    def netns_file(self, node: Node) -> str | None:
        return None  # on another node

    def gpu_count(self, node: Node) -> int:
        return self.slurm_machines.gpus.get(self.spread.machine(node), 0)

    def start(self, node: Node, argv: list[str], env: dict[str, str], log_file: IO[bytes],
              outputs: list[tuple[PurePath, Path]] = (),
              cwd: PurePath | None = None) -> AlignedStep:
        """A step running ``argv`` in ``node`` (srun passes the environment on); its traces
        are moved onto this clock when it exits."""
        proc = self.popen(node, argv, env=dict(os.environ, **env), stdout=log_file,
                          stderr=log_file, cwd=cwd)
        step = AlignedStep(proc, outputs, self.slurm_machines.clocks[self.spread.machine(node)])
        self.procs.append(step)
        return step

    def row_notes(self) -> dict[str, Any]:
        return self.spread.notes()

    def close_connections(self) -> None:
        """Nothing held open: every step is its own srun."""


class SlurmMachines(Machines):
    """The nodes of the Slurm allocation this process runs in."""

    def __init__(self, clock_samples: int):
        self.clock_samples = clock_samples
        self.nodes: list[slurm.SlurmNode] = []
        self.cores: dict[str, int] = {}
        self.gpus: dict[str, int] = {}
        self.ifaces: dict[str, str] = {}
        self.netem: dict[str, bool] = {}
        self.clocks: dict[str, NodeClock] = {}

    def open(self) -> None:
        """Read the allocation's nodes and, with one step per node, each node's interface on
        its address, netem and clock offset."""
        self.nodes = slurm.allocation_nodes()
        held = job_cpus()
        for i, n in enumerate(self.nodes):
            self.cores[n.name] = held[i] if i < len(held) else n.cpus
            self.gpus[n.name] = n.gpus
            self.ifaces[n.name], self.netem[n.name] = self._probe(n)
            self.clocks[n.name] = measure_clock(n.name, self.clock_samples)

    def _probe(self, n: slurm.SlurmNode) -> tuple[str, bool]:
        script = f"ip -o -4 addr show; echo ---; ({NETEM_PROBE[2]}) && echo netem || true"
        r = subprocess.run(slurm.srun_argv(n.name, ["sh", "-c", script]), capture_output=True,
                           text=True, timeout=PROBE_TIMEOUT_S)
        if r.returncode != 0:
            raise MachineError(f"node {n.name}: srun failed ({r.returncode}): "
                               f"{(r.stderr or r.stdout).strip()[-300:]}",
                               "check that the allocation's steps start on it")
        addrs, _, rest = r.stdout.partition("---")
        addr = str(ipaddress.IPv4Address(socket.gethostbyname(n.addr)))
        for line in addrs.splitlines():
            words = line.split()
            if len(words) > 3 and words[3].split("/")[0] == addr:
                return words[1], "netem" in rest
        raise MachineError(f"node {n.name} has no interface with its address {addr}",
                           "give the node a NodeAddr it holds (slurm.conf)")

    def close(self) -> None:
        pass

    def planned_capacities(self) -> list[Machine]:
        if not slurm.in_allocation():
            return []
        held = job_cpus()
        return [Machine(n.name, held[i] if i < len(held) else n.cpus,
                        round(n.memory_mb / 1024, 1), n.gpus)
                for i, n in enumerate(slurm.allocation_nodes())]

    def capacities(self) -> list[Machine]:
        return [Machine(n.name, self.cores[n.name], round(n.memory_mb / 1024, 1), n.gpus)
                for n in self.nodes]

    def underlay(self, machine: str) -> tuple[ipaddress.IPv4Address, str]:
        n = next(n for n in self.nodes if n.name == machine)
        return ipaddress.IPv4Address(socket.gethostbyname(n.addr)), self.ifaces[machine]

    def netem_everywhere(self) -> bool:
        return all(self.netem.values())

    def network(self, topology, links, ledger, backend, files) -> SlurmNetwork:
        return SlurmNetwork(topology=topology, links=links, ledger=ledger, backend=backend,
                            slurm_machines=self, files=files)

    def put_share(self, net: SlurmNetwork, machine: str, text: str) -> str:
        path = net.files / f"share-{machine}.json"
        with writing(path):
            net.files.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return str(path.resolve())

    def start_agent(self, net: SlurmNetwork, machine: str, argv: list[str]) -> Agent:
        out = AgentOutput()
        proc = subprocess.Popen(slurm.srun_argv(machine, argv), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        net.ledger.add_process(proc.pid)

        def pump() -> None:
            for chunk in iter(lambda: proc.stdout.read1(65536), b""):
                out.write(chunk)
        threading.Thread(target=pump, daemon=True, name=f"agent-{machine}").start()
        return Agent(proc, out, proc.stdin.close)

    def finish(self, net: SlurmNetwork, machine: str) -> None:
        pass  # its files are the run's, in the results directory

    def ledger_entry(self, net: SlurmNetwork) -> dict:
        return {"slurm_job": os.environ.get("SLURM_JOB_ID", "")}

    def clock_report(self) -> dict:
        return {name: c.as_dict() for name, c in self.clocks.items()}
