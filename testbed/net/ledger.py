"""Tags and the ledger: how every kernel object and process of a run is found again.

A run's tag is ``tb`` + 6 hex digits (e.g. ``tb3f09a1``). Everything the netns backend makes
lives inside network namespaces whose names start with ``<tag>-``: interfaces, bridges, qdiscs
and iptables rules go away with their namespace, so removing the tagged namespaces (after
stopping the processes inside them) removes everything. Backends that must create objects in
the root namespace (Mininet's bridges and veths) name them ``<tag>…`` and list them in the
ledger.

The ledger is one JSON file per live network in ``/run/testbed/`` (tmpfs: gone after a reboot,
like the namespaces it describes). It records the owning process, so ``clean`` removes only
networks whose owner is dead (a SIGKILLed runner) unless told to take live ones too.
"""
from __future__ import annotations

import json
import logging
import os
import re
import secrets
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.process import STOP_GRACE_S
from testbed.errors import NetworkError

log = logging.getLogger(__name__)

LEDGER_DIR = Path(os.environ.get("TESTBED_LEDGER_DIR", "/run/testbed"))
TAG_RE = re.compile(r"^tb[0-9a-f]{6}$")
NETNS_DIR = Path("/run/netns")
IP_TIMEOUT_S = 30.0  # one `ip` command of teardown; one that takes longer has failed
_SAVING = threading.Lock()  # a ledger is saved from the threads that work on hosts in parallel


def new_tag() -> str:
    """A fresh run tag: ``tb`` + 6 random hex digits (fits interface names with room to spare)."""
    return "tb" + secrets.token_hex(3)


def tag_of(name: str) -> str | None:
    """The run tag a namespace or interface name carries, or None if it is not ours."""
    head = name.split("-", 1)[0]
    if TAG_RE.match(head):
        return head
    return head[:8] if TAG_RE.match(head[:8]) else None


def proc_start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (to tell reused pids apart)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


@dataclass
class Ledger:
    """What one network made: its namespaces, root-namespace links and processes."""

    tag: str
    owner_pid: int = field(default_factory=os.getpid)
    owner_start: int | None = None
    backend: str = "netns"
    namespaces: list[str] = field(default_factory=list)
    root_links: list[str] = field(default_factory=list)
    processes: list[list[int]] = field(default_factory=list)  # [pid, start time]
    # a network spread over machines (backend cluster): how to reach them and each machine's
    # own tag, so that ``clean`` removes their shares too (testbed.net.cluster.clean)
    machines: dict = field(default_factory=dict)
    # a network of lab hosts (backend remote): how to reach them and what it left there (run
    # directory, shaped NICs, processes), so that ``clean`` removes it (testbed.net.lab.clean)
    lab: dict = field(default_factory=dict)
    created: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if self.owner_start is None:
            self.owner_start = proc_start_time(self.owner_pid)

    @property
    def path(self) -> Path:
        return LEDGER_DIR / f"{self.tag}.json"

    def save(self) -> None:
        """Write the ledger atomically (called after every object is added)."""
        with _SAVING:
            LEDGER_DIR.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(asdict(self)))
            os.replace(tmp, self.path)

    def add_namespace(self, name: str) -> None:
        self.namespaces.append(name)
        self.save()

    def add_process(self, pid: int) -> None:
        self.processes.append([pid, proc_start_time(pid) or 0])
        self.save()

    def owner_alive(self) -> bool:
        return (self.owner_start is not None
                and proc_start_time(self.owner_pid) == self.owner_start)

    def remove_file(self) -> None:
        self.path.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: Path) -> "Ledger":
        return cls(**json.loads(path.read_text()))


def recorded(include_live: bool = False, tag: str | None = None) -> list[Ledger]:
    """This machine's readable ledgers whose owner is gone (or all, with ``include_live``),
    optionally only ``tag``'s."""
    out = []
    for path in sorted(LEDGER_DIR.glob("tb*.json")) if LEDGER_DIR.is_dir() else []:
        try:
            led = Ledger.load(path)
        except (ValueError, TypeError, OSError):
            continue
        if (tag is None or led.tag == tag) and (include_live or not led.owner_alive()):
            out.append(led)
    return out


def tagged_namespaces() -> list[str]:
    """Every namespace in /run/netns whose name carries a run tag."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(n for n in os.listdir(NETNS_DIR) if tag_of(n))


def namespace_pids(ns: str) -> list[int]:
    """Pids of the processes whose network namespace is ``ns`` (``ip netns pids``)."""
    res = _ip(["netns", "pids", ns])
    return [int(p) for p in res.stdout.split() if p.isdigit()]


def _ip(args: list[str]) -> subprocess.CompletedProcess:
    """``ip ARGS``, within IP_TIMEOUT_S (a command that does not end is a failure)."""
    try:
        return subprocess.run(["ip", *args], capture_output=True, text=True,
                              timeout=IP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(["ip", *args], -1, "",
                                           f"timed out after {IP_TIMEOUT_S:g} s")


def stop_pids(pids: list[int], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL and wait up to ``grace_s`` again; pids
    already gone are fine."""
    alive = [p for p in pids if _signal(p, signal.SIGTERM)]
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if pid_alive(p)]
    for p in alive:
        _signal(p, signal.SIGKILL)
    deadline = time.monotonic() + grace_s  # SIGKILL is not instant: wait for them to go
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if pid_alive(p)]
        if alive:
            time.sleep(0.02)


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def delete_namespace(ns: str) -> str | None:
    """Stop every process inside ``ns``, then delete it (and with it its links, qdiscs, rules).
    Returns None when it is gone (or never existed), else why it is still there."""
    stop_pids(namespace_pids(ns))
    res = _ip(["netns", "del", ns])
    if res.returncode != 0 and (NETNS_DIR / ns).exists():
        return f"namespace {ns}: {(res.stderr or res.stdout).strip() or 'ip netns del failed'}"
    return None


def delete_root_link(name: str) -> str | None:
    """Delete an interface of the root namespace if it exists and carries a run tag. Returns
    None when it is gone, else why it is still there."""
    if not tag_of(name):
        raise ValueError(f"refusing to delete untagged interface {name!r}")
    res = _ip(["link", "del", name])
    if res.returncode != 0 and Path(f"/sys/class/net/{name}").exists():
        return f"interface {name}: {(res.stderr or res.stdout).strip() or 'ip link del failed'}"
    return None


def destroy(ledger: Ledger) -> None:
    """Remove everything a ledger lists, in reverse order of creation; idempotent.

    Raises NetworkError naming what could not be removed; those objects stay in the ledger
    (its file is kept), so ``clean`` tries them again."""
    own = [pid for pid, start in ledger.processes if proc_start_time(pid) == start]
    stop_pids(own)
    alive = [[p, s] for p, s in ledger.processes if pid_alive(p) and proc_start_time(p) == s]
    extra = [ns for ns in tagged_namespaces()  # made but not written down when the builder died
             if tag_of(ns) == ledger.tag and ns not in ledger.namespaces]
    ns_why = {ns: why for ns in reversed(ledger.namespaces + extra)
              if (why := delete_namespace(ns))}
    link_why = {link: why for link in reversed(ledger.root_links)
                if (why := delete_root_link(link))}
    failures = [*ns_why.values(), *link_why.values(),
                *(f"process {p}: still running after SIGKILL" for p, _ in alive)]
    if not failures:
        ledger.remove_file()
        return
    ledger.processes = alive
    ledger.namespaces = [ns for ns in ledger.namespaces + extra if ns in ns_why]
    ledger.root_links = [link for link in ledger.root_links if link in link_why]
    ledger.save()
    raise NetworkError(f"teardown of {ledger.tag} left things behind (kept in {ledger.path}; "
                       "`python -m testbed clean` retries): " + "; ".join(failures))


@dataclass
class CleanReport:
    removed: list[str] = field(default_factory=list)
    skipped_live: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)   # what could not be removed, and why


def clean(include_live: bool = False, tag: str | None = None) -> CleanReport:
    """Remove tagged networks whose owner process is dead (or all, with ``include_live``).

    Also removes tagged namespaces no ledger mentions (a builder killed before it saved).
    Never touches anything without a run tag. The namespaces are listed before the ledgers:
    a builder saves its ledger before it makes a namespace, so every namespace of a network
    being built meanwhile has its ledger in the listing (listed the other way round, a
    network built by another run between the two listings looked unowned and was deleted)."""
    report = CleanReport()
    namespaces = tagged_namespaces()
    ledgers = sorted(LEDGER_DIR.glob("tb*.json")) if LEDGER_DIR.is_dir() else []
    known: set[str] = set()
    for path in ledgers:
        try:
            led = Ledger.load(path)
        except (ValueError, TypeError, OSError) as e:
            log.warning("unreadable ledger %s: %s", path, e)
            continue
        known.add(led.tag)
        if (tag and led.tag != tag) or led.machines or led.lab:  # elsewhere: their own clean
            continue
        if led.owner_alive() and not include_live:
            report.skipped_live.append(led.tag)
            continue
        try:
            destroy(led)
            report.removed.append(led.tag)
        except NetworkError as e:
            report.failed.append(str(e))
    for ns in namespaces:
        t = tag_of(ns)
        if t in known or (tag and t != tag) or not (NETNS_DIR / ns).exists():
            continue  # owned, not asked for, or torn down by its owner since the listing
        why = delete_namespace(ns)
        (report.failed if why else report.removed).append(why or ns)
    return report
