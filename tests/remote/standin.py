"""Stand-in lab hosts: OpenSSH servers in network namespaces of this machine.

One namespace per host (``<tag>-<dc>-<j>``, interface ``eth0``) on a bridge ``<tag>br`` in the
root namespace, which carries the controller's address (``10.<x>.0.1/16``). DC i's hosts live
in ``10.<x>.<i>.0/24`` and reach other DCs on-link through the /16, so tc filters by
destination DC subnet have real subnets to match. Each host runs its own sshd (``-D``, a
generated ed25519 host key, key-only root login); the client key and known_hosts are generated
too. Everything is written into a testbed ledger before it is made, so ``stop`` (and
``python -m testbed clean`` after a crash) removes the namespaces, the bridge, the veths and
the sshd processes.
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed.net import ledger as ledgers
from testbed.net.ledger import Ledger
from testbed.net.tcp import allow_congestion_control

from labuser import LabUser, role_default
from octets import reserve_octet

ROOT = Path(__file__).resolve().parents[2]
SSHD = "/usr/sbin/sshd"
PIP_CONFIG = Path.home() / ".config" / "pip"
SSHD_START_TIMEOUT_S = 10.0
SSHD_CONFIG = """\
Port 22
ListenAddress {ip}
HostKey {hostkey}
PidFile none
AuthorizedKeysFile {authorized}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
"""


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, text=True)


def keygen(path: Path) -> str:
    """A new passphrase-less ed25519 key at ``path``; returns the public key line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)],
                   check=True, capture_output=True)
    return path.with_suffix(".pub").read_text().strip()


@dataclass
class StandIn:
    """One stand-in host."""

    name: str
    dc: str
    index: int
    ns: str
    ip: str
    prefix: int
    host_pub: str
    proc: subprocess.Popen | None = None


@dataclass
class StandInLab:
    """Stand-in hosts per DC, their keys, and the files the remote backend reads."""

    workdir: Path
    dcs: dict[str, int]
    tag: str = field(default_factory=ledgers.new_tag)
    hosts: list[StandIn] = field(default_factory=list)
    non_root: bool = False  # log in as a tagged user with the sshaccess role's sudo rule
    mtu: int | None = None  # the bridge's, the veths' and eth0's (None: the kernel's 1500)

    def __post_init__(self) -> None:
        self.ledger = Ledger(self.tag, backend="standin")
        # 200..249: tests/slurm's stand-in clusters take 150..199, so both can run at once
        self._octet = reserve_octet(200, 50, int(self.tag[2:], 16))
        self.octet = self._octet.value
        self.client_key = self.workdir / "id_ed25519"
        self.bridge = f"{self.tag}br"
        self.user = LabUser(f"{self.tag}u") if self.non_root else None

    # ---- set-up and teardown

    def start(self) -> "StandInLab":
        """Create the bridge, the namespaces and the sshd processes; on failure, stop()."""
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation
            pub = keygen(self.client_key)
            (self.workdir / "authorized_keys").write_text(pub + "\n")
            self.ledger.save()
            if self.user is not None:
                self.user.create(pub)
            self._bridge()
            for i, (dc, n) in enumerate(self.dcs.items(), start=1):
                for j in range(n):
                    self.hosts.append(self._host(dc, i, j))
            for h in self.hosts:
                self._wait_sshd(h)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every sshd, delete the namespaces, the veths and the bridge (and the non-root
        user); idempotent."""
        try:
            ledgers.destroy(self.ledger)
        finally:
            self._octet.release()
            if self.user is not None:
                self.user.remove()

    def _bridge(self) -> None:
        self.ledger.root_links.append(self.bridge)
        self.ledger.save()
        _ip("link", "add", self.bridge, "type", "bridge")
        if self.mtu is not None:
            _ip("link", "set", self.bridge, "mtu", str(self.mtu))
        _ip("addr", "add", f"10.{self.octet}.0.1/16", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def _host(self, dc: str, i: int, j: int) -> StandIn:
        ns, veth = f"{self.tag}-{dc}-{j}", f"{self.tag}v{i}{j}"
        ip = f"10.{self.octet}.{i}.{10 + j}"
        self.ledger.add_namespace(ns)
        self.ledger.root_links.append(veth)
        self.ledger.save()
        _ip("netns", "add", ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        if self.mtu is not None:
            _ip("link", "set", veth, "mtu", str(self.mtu))
            _ip("-n", ns, "link", "set", "eth0", "mtu", str(self.mtu))
        _ip("link", "set", veth, "master", self.bridge, "up")
        for argv in (["link", "set", "lo", "up"], ["addr", "add", f"{ip}/24", "dev", "eth0"],
                     ["link", "set", "eth0", "up"],
                     ["route", "add", f"10.{self.octet}.0.0/16", "dev", "eth0"]):
            _ip("-n", ns, *argv)
        # a provisioned lab host: the TCP settings ansible's nettune role applies (the same
        # the emulated hosts get), not this machine's defaults (bbr here)
        allow_congestion_control("cubic")
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w",
                        "net.ipv4.tcp_congestion_control=cubic",
                        "net.ipv4.tcp_slow_start_after_idle=0",
                        f"net.ipv4.ping_group_range={role_default('sshaccess_ping_group_range')}"],
                       check=True)
        d = self.workdir / ns
        d.mkdir()
        host = StandIn(f"{dc}-{j}", dc, j, ns, ip, 24, keygen(d / "hostkey"))
        keys = [self.workdir / "authorized_keys"]
        if self.user is not None:
            keys.append(self.user.authorized_keys)
        (d / "sshd_config").write_text(SSHD_CONFIG.format(
            ip=ip, hostkey=d / "hostkey", authorized=" ".join(map(str, keys))))
        home = d / "root-home"
        home.mkdir(mode=0o700)
        if PIP_CONFIG.is_dir():  # where this machine's pip finds its packages, as a lab's would
            shutil.copytree(PIP_CONFIG, home / ".config" / "pip")
        with open(d / "sshd.log", "wb") as logf:
            # ``ip netns exec`` gives the sshd a mount namespace of its own, in which root's home
            # is a directory of its own holding only pip's configuration: a login runs no
            # dotfiles of this machine's root (here a .bashrc whose pyenv set-up started about
            # 80 processes, 0.1 s, per remote command: results/leads/standin-login) and writes
            # nothing into its home (ansible's ~/.ansible/tmp), as on a fresh host
            host.proc = subprocess.Popen(
                ["ip", "netns", "exec", ns, "sh", "-c", 'mount --bind "$0" /root && exec "$@"',
                 str(home), SSHD, "-D", "-e", "-f", str(d / "sshd_config")],
                stdout=logf, stderr=logf, start_new_session=True)
        self.ledger.add_process(host.proc.pid)
        return host

    def _wait_sshd(self, h: StandIn) -> None:
        deadline = time.monotonic() + SSHD_START_TIMEOUT_S
        while True:
            try:
                with socket.create_connection((h.ip, 22), timeout=0.5):
                    return
            except OSError:
                if h.proc.poll() is not None or time.monotonic() > deadline:
                    log = (self.workdir / h.ns / "sshd.log").read_text(errors="replace")
                    raise RuntimeError(f"sshd in {h.ns} did not start: {log[-500:]}") from None
                time.sleep(0.05)

    # ---- files for the remote backend

    def known_hosts(self, path: Path, only: list[str] | None = None) -> Path:
        """Write a known_hosts file with the hosts' keys (all, or those named in ``only``)."""
        lines = [f"{h.ip} {h.host_pub}" for h in self.hosts if only is None or h.name in only]
        path.write_text("".join(line + "\n" for line in lines))
        return path

    def inventory(self, path: Path, extra_vars: str = "") -> Path:
        """Write an Ansible INI inventory: one group per DC, root login (the non-root user's with
        ``non_root``) with the client key, workers running from this checkout's virtualenv."""
        out = []
        for dc in self.dcs:
            out.append(f"[{dc}]")
            for h in (h for h in self.hosts if h.dc == dc):
                out.append(f"{h.name} ansible_host={h.ip} testbed_iface=eth0 "
                           f"testbed_addr={h.ip}/{h.prefix}")
            out.append("")
        login = self.user.name if self.user is not None else "root"
        out += ["[testbed:children]", *self.dcs, "", "[testbed:vars]", f"ansible_user={login}",
                f"ansible_ssh_private_key_file={self.client_key}", f"testbed_home={ROOT}",
                f"testbed_python={sys.executable}", extra_vars, ""]
        path.write_text("\n".join(out))
        return path

    def alive(self) -> list[str]:
        """Names of the namespaces of this lab that still exist."""
        return [n for n in ledgers.tagged_namespaces() if n.startswith(self.tag + "-")]
