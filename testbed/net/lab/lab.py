"""A connected lab: every host reached over SSH (host keys checked), its testbed and torch
versions compared with the controller's, its clock offset and NTP state measured, and whether
its kernel has netem, its GPUs and whether its interface towards the other DCs is InfiniBand
or RoCE (``testbed.net.rdma``). All per-host steps run in parallel; one error lists every
failing host."""
from __future__ import annotations

import json
import logging
import platform
from importlib import metadata
from dataclasses import dataclass, field
from pathlib import Path

from fabric import Connection

import testbed

from testbed.errors import MachineError
from testbed.net.network import GPU_DEVICES
from testbed.net.lab import clocks, ssh
from testbed.net.lab.inventory import Inventory, LabHost, load_inventory
from testbed.net.rdma import SYSFS, parse_rdma, rdma_probe

log = logging.getLogger(__name__)

# testbed's and torch's versions as installed on the host, read from the packages' metadata, as
# local_versions reads the controller's: importing torch only to ask (1.5 s of CPU per host, per
# run) would check nothing the ranks' own start does not; a host without torch reports None
VERSION_PROBE = ("import json, platform, testbed; from importlib import metadata; "
                 "torch = next((d.version for d in metadata.distributions(name='torch')), None); "
                 "print(json.dumps({'testbed': testbed.__version__, 'torch': torch, "
                 "'python': platform.python_version()}))")
# netem is usable when loaded or loadable; -n only looks, it loads nothing
NETEM_PROBE = ["sh", "-c", "test -d /sys/module/sch_netem || "
               "PATH=$PATH:/usr/sbin:/sbin modprobe -n -q sch_netem"]  # non-root PATH: no sbin
VERSION_TIMEOUT_S = 60.0  # a Python start on a cold, busy host


def gpu_probe(pattern: str = GPU_DEVICES) -> list[str]:
    """A command printing how many files match ``pattern`` (a host's GPUs, see
    ``testbed.net.network.GPU_DEVICES``): 0 when the glob matches nothing and stays literal."""
    return ["sh", "-c", f'set -- {pattern}; if [ -e "$1" ]; then echo "$#"; else echo 0; fi']


def gpu_count(conn: Connection, host: LabHost, pattern: str = GPU_DEVICES) -> int:
    """GPUs of one lab host (device files matching ``pattern``); raises CommandError when the
    probe fails."""
    return int(ssh.run(conn, host, gpu_probe(pattern)).stdout.split()[-1])


def rdma_kind(conn: Connection, host: LabHost, sysfs: str = SYSFS) -> str | None:
    """InfiniBand or RoCE where the host's interface towards the other DCs (``testbed_iface``)
    carries RDMA, read from ``sysfs`` on the host; None otherwise. Raises CommandError when
    the probe fails."""
    return parse_rdma(ssh.run(conn, host, rdma_probe(host.iface, sysfs)).stdout)


def local_versions() -> dict[str, str]:
    """testbed's and torch's versions on the controller (torch's from its installed
    metadata: the controller never needs to import it)."""
    return {"testbed": testbed.__version__, "torch": metadata.version("torch"),
            "python": platform.python_version()}


def _public(version: str | None) -> str | None:
    """A version without its local label: torch 2.13.0+cpu and 2.13.0 are the same release."""
    return version.split("+", 1)[0] if version else version


def resolve_path(ref: str, base: Path) -> Path:
    """``ref`` with ``~`` expanded, relative to ``base`` (the experiment file's directory)."""
    p = Path(ref).expanduser()
    return p if p.is_absolute() else (base / p).resolve()


@dataclass
class Lab:
    """Open connections to an inventory's hosts and what was learnt about them (versions,
    clock offsets, netem, GPUs per host, and whether its inter-DC interface carries RDMA:
    InfiniBand, RoCE or None)."""

    inventory: Inventory
    known_hosts: Path
    conns: dict[str, Connection] = field(default_factory=dict)
    versions: dict[str, dict] = field(default_factory=dict)
    offsets: dict[str, clocks.ClockOffset] = field(default_factory=dict)
    netem: dict[str, bool] = field(default_factory=dict)
    gpus: dict[str, int] = field(default_factory=dict)
    rdma: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def open(cls, inventory: Path, dcs: list[str], known_hosts: str | Path,
             connect_timeout_s: float = ssh.CONNECT_TIMEOUT_S,
             clock_samples: int = clocks.DEFAULT_SAMPLES) -> "Lab":
        """Connect to the hosts of the groups ``dcs`` and check them; closes what it opened
        and raises RemoteError (every failing host) or SpecError (a bad inventory)."""
        lab = cls(load_inventory(inventory, dcs), Path(known_hosts).expanduser())
        try:
            lab.conns = ssh.each(lab.hosts(), lambda h: ssh.connect(
                h, lab.known_hosts, connect_timeout_s), "connecting")
            lab.check_versions()
            lab.offsets = lab.each(lambda h, c: clocks.measure(c, h, clock_samples),
                                  "measuring clock offsets")
            lab.netem = lab.each(lambda h, c: ssh.run(c, h, NETEM_PROBE, check=False)
                                 .returncode == 0, "probing netem")
            lab.gpus = lab.each(lambda h, c: gpu_count(c, h), "counting GPUs")
            lab.rdma = lab.each(lambda h, c: rdma_kind(c, h), "probing RDMA interfaces")
        except BaseException:
            lab.close()
            raise
        return lab

    def hosts(self) -> list[LabHost]:
        return self.inventory.hosts()

    def host(self, name: str) -> LabHost:
        return next(h for h in self.hosts() if h.name == name)

    def each(self, fn, step: str, hosts: list[LabHost] | None = None) -> dict:
        """``fn(host, connection)`` on every host (or ``hosts``) in parallel; see ssh.each."""
        return ssh.each(hosts if hosts is not None else self.hosts(),
                        lambda h: fn(h, self.conns[h.name]), step)

    def check_versions(self) -> None:
        """Raise RemoteError naming every host whose testbed or torch differs from here."""
        want = local_versions()
        self.versions = self.each(lambda h, c: json.loads(ssh.run(
            c, h, [h.python, "-c", VERSION_PROBE], timeout=VERSION_TIMEOUT_S)
            .stdout.strip().splitlines()[-1]), "checking versions")
        bad = {}
        for name, got in self.versions.items():
            diff = [f"{k} {got.get(k)} (controller {v})" for k, v in want.items()
                    if k != "python" and _public(got.get(k)) != _public(v)]
            if diff:
                bad[name] = ", ".join(diff) + "; run the Ansible playbook (roles pyenv, deploy)"
        if bad:
            raise ssh.RemoteError("checking versions", bad)

    def shaper_choice(self, requested: str) -> tuple[str, str]:
        """(shaper name, reason) for the lab: ``netem`` when every host has it, else ``htb``
        (rate and queue only: cells that ask for delay, jitter or loss fail, saying why).
        Raises MachineError for ``delayline`` or for ``netem`` on hosts without it."""
        lacking = sorted(n for n, ok in self.netem.items() if not ok)
        if requested == "delayline":
            raise MachineError("shaper delayline runs in the emulator's router namespaces, not "
                               "on lab hosts", "use shaper: auto or netem with backend: remote")
        if requested == "netem" and lacking:
            raise MachineError(f"shaper netem: no sch_netem on {', '.join(lacking)}",
                               "install the kernel's netem module (e.g. linux-modules-extra) "
                               "or use shaper: auto for rate-only shaping")
        if not lacking:
            return "netem", "every lab host has sch_netem"
        return "htb", (f"no sch_netem on {', '.join(lacking)}: rate and queue only (htb); "
                       "cells with delay, jitter or loss fail")

    def clock_report(self) -> dict[str, dict]:
        return {name: c.as_dict() for name, c in self.offsets.items()}

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()
        self.conns = {}


@dataclass(frozen=True)
class LabSettings:
    """Which lab to connect to, from an experiment's ``remote`` section with its paths
    resolved against the experiment file's directory."""

    inventory: Path
    dcs: tuple[str, ...]
    known_hosts: Path
    workdir: str = "/tmp"
    connect_timeout_s: float = ssh.CONNECT_TIMEOUT_S
    clock_samples: int = clocks.DEFAULT_SAMPLES

    @classmethod
    def of(cls, exp, base: Path) -> "LabSettings":
        """The settings of ``exp`` (an Experiment with a ``remote`` section) whose file lives
        in ``base``."""
        r = exp.remote
        return cls(resolve_path(r.inventory, base), tuple(dc.name for dc in exp.topology.dcs),
                   resolve_path(r.known_hosts, base), r.workdir, r.connect_timeout_s,
                   r.clock_samples)

    def open(self) -> Lab:
        """The lab, connected and checked (see Lab.open)."""
        return Lab.open(self.inventory, list(self.dcs), self.known_hosts,
                        self.connect_timeout_s, self.clock_samples)
