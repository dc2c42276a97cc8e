"""What this machine can do: kernel features (tried for real in a throwaway namespace), tools,
Python packages, and which backend and shaper ``auto`` would pick, and why.

Needs root for the kernel checks; without root they are reported as unknown.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

from testbed.errors import EXIT_MACHINE, EXIT_OK

APT_HINT = "install it with: apt-get install {pkg} (or run: bash setup.sh)"


@dataclass
class Check:
    """One capability: ok is True/False, or None when it could not be tried (not root)."""

    name: str
    ok: bool | None
    detail: str = ""
    required: bool = False


@dataclass
class ProbeReport:
    checks: list[Check] = field(default_factory=list)
    shaper: str = ""
    shaper_reason: str = ""
    backend: str = ""
    backend_reason: str = ""

    def get(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    def ok(self, name: str) -> bool:
        c = self.get(name)
        return bool(c and c.ok)

    @property
    def exit_code(self) -> int:
        """3 when something required is missing, else 0."""
        return EXIT_MACHINE if any(c.required and c.ok is False for c in self.checks) else EXIT_OK


def _run(argv: list[str], timeout: float = 10) -> tuple[bool, str]:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    lines = (r.stderr or r.stdout).strip().splitlines()
    return r.returncode == 0, lines[-1] if lines else ""


def _tool(name: str, pkg: str, required: bool = False, why: str = "") -> Check:
    path = shutil.which(name)
    detail = path or f"missing; {APT_HINT.format(pkg=pkg)}"
    return Check(f"tool {name}", path is not None, f"{detail}{f' ({why})' if why else ''}",
                 required)


def _python_pkg(name: str, required: bool = False) -> Check:
    spec = importlib.util.find_spec(name)
    version = ""
    if spec is not None:
        try:
            from importlib.metadata import version as v
            version = v(name)
        except Exception:  # noqa: BLE001 - a version string is only decoration here
            version = "present"
    return Check(f"python {name}", spec is not None, version or "missing; run: bash setup.sh",
                 required)


def _kernel_checks(ns: str) -> list[Check]:
    ipn = ["ip", "netns", "exec", ns]
    ok, msg = _run(["ip", "netns", "add", ns])
    checks = [Check("netns", ok, msg or "network namespaces", required=True)]
    if not ok:
        return checks
    ok, msg = _run(ipn + ["ip", "link", "add", "tbpa", "type", "veth", "peer", "name", "tbpb"])
    checks.append(Check("veth", ok, msg or "veth pairs", required=True))
    ok_br, msg = _run(ipn + ["ip", "link", "add", "tbpbr", "type", "bridge"])
    checks.append(Check("bridge", ok_br, msg or "Linux bridge", required=True))
    for qdisc, args in [("htb", ["htb"]), ("tbf", ["tbf", "rate", "1mbit", "burst", "32kb",
                                                   "latency", "50ms"]),
                        ("bfifo", ["bfifo", "limit", "100000"]),
                        ("netem", ["netem", "delay", "1ms"])]:
        ok, msg = _run(ipn + ["tc", "qdisc", "replace", "dev", "tbpa", "root"] + args)
        checks.append(Check(f"qdisc {qdisc}", ok, "" if ok else msg))
    ok, msg = _run(ipn + ["iptables", "-w", "-A", "FORWARD", "-j", "NFQUEUE", "--queue-num", "0"])
    checks.append(Check("iptables NFQUEUE", ok, "" if ok else msg))
    return checks


@functools.lru_cache(maxsize=1)
def kernel_has_netem() -> bool:
    """Whether the kernel accepts a netem qdisc; tried in a throwaway namespace ``tbnetem<pid>``
    (always deleted). Cached for the life of the process."""
    ns = f"tbnetem{os.getpid()}"
    try:
        if not _run(["ip", "netns", "add", ns])[0]:
            return False
        ipn = ["ip", "netns", "exec", ns]
        _run(ipn + ["ip", "link", "add", "tbpa", "type", "veth", "peer", "name", "tbpb"])
        return _run(ipn + ["tc", "qdisc", "replace", "dev", "tbpa", "root", "netem",
                           "delay", "1ms"])[0]
    finally:
        _run(["ip", "netns", "del", ns])


def probe() -> ProbeReport:
    """Try every capability; creates and always deletes one namespace ``tbprobe<pid>``."""
    report = ProbeReport()
    root = os.geteuid() == 0
    report.checks.append(Check("root", root, "" if root else "run as root (sudo) for the kernel "
                               "checks and for run/net/clean", required=True))
    report.checks += [
        _tool("ip", "iproute2", True), _tool("tc", "iproute2", True),
        _tool("iptables", "iptables", why="userspace delay line"),
        _tool("iperf3", "iperf3", why="throughput fidelity checks"),
        _tool("mnexec", "mininet", why="mininet backend"),
        _tool("sshd", "openssh-server", why="remote backend tests"),
        _python_pkg("torch", True), _python_pkg("pyroute2", True), _python_pkg("mininet"),
    ]
    if root and shutil.which("ip"):
        ns = f"tbprobe{os.getpid()}"
        try:
            report.checks += _kernel_checks(ns)
        finally:
            _run(["ip", "netns", "del", ns])
    else:
        report.checks += [Check(n, None, "needs root to try") for n in
                          ("netns", "veth", "bridge", "qdisc htb", "qdisc netem",
                           "iptables NFQUEUE")]
    _decide(report)
    return report


def _decide(report: ProbeReport) -> None:
    if report.ok("qdisc netem"):
        report.shaper, report.shaper_reason = "netem", "the kernel has sch_netem"
    elif report.ok("iptables NFQUEUE") and (report.ok("qdisc htb") or report.ok("qdisc tbf")):
        report.shaper = "delayline"
        report.shaper_reason = ("the kernel lacks sch_netem; delay from the userspace NFQUEUE "
                                "delay line, rate and queue from htb/tbf + bfifo")
    else:
        report.shaper = "none"
        report.shaper_reason = "neither sch_netem nor iptables NFQUEUE with htb/tbf works here"
        report.checks.append(Check("a shaper", False, report.shaper_reason, required=True))
    if report.ok("netns") and report.ok("veth") and report.ok("bridge"):
        report.backend, report.backend_reason = "netns", "namespaces, veths and bridges work"
    else:
        report.backend, report.backend_reason = "none", "network namespaces are not usable"


def print_report(report: ProbeReport, console: Console) -> None:
    """Print the checks and the choices as a table."""
    table = Table(title="testbed probe")
    table.add_column("capability")
    table.add_column("status")
    table.add_column("detail")
    marks = {True: "[green]yes[/]", False: "[red]NO[/]", None: "[yellow]unknown[/]"}
    for c in report.checks:
        table.add_row(c.name, marks[c.ok], c.detail)
    console.print(table)
    console.print(f"backend [bold]netns[/] (experiment default): {report.backend_reason}")
    console.print(f"shaper auto → [bold]{report.shaper}[/]: {report.shaper_reason}")
