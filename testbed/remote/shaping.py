"""Inter-DC shaping on lab hosts: tc argv run over SSH, read back, removed afterwards.

One NIC per host carries the traffic to every other DC, so each destination DC gets its own
htb class, selected by u32 filters on the destination DC's subnets; unclassified traffic (the
host's own DC, SSH) goes to htb's direct queue, unshaped. Per destination DC with minor m
(``0x10 +`` the DC's position in the topology):

- delay, jitter or loss wanted (needs netem): ``class 1:m htb`` at the unshaped rate (it only
  classifies), ``m00: netem …`` as its leaf, and with a rate ``parent m00:1 m01: tbf`` for rate
  and queue, as ``testbed.net.shaping.tc`` lays out netem on a single link;
- rate only: ``class 1:m htb rate R ceil R`` with a ``m00: bfifo`` leaf holding the queue;
- neither: no class, no filter.

Before shaping, the NIC's root qdisc must be a kernel default (noqueue, pfifo_fast, mq,
fq_codel, fq…): anything else is someone's shaping and is left alone (the cell fails saying
how to remove it). Removal deletes the root qdisc, which gives the NIC its default back.
A host without sch_netem gets rate-only shaping; asking it for delay fails before anything is
applied. Each host's NIC is its own bottleneck: with several hosts per DC, a link's rate is per
host pair, not shared by the DC as on the emulated router (see docs/howto/lab.md).
"""
from __future__ import annotations

import ipaddress
import logging
import re
from dataclasses import dataclass, field

from testbed.errors import CommandError, ShapingError, TestbedError
from testbed.net.shaping import tc
from testbed.net.shaping.interface import Shaper
from testbed.topology import LinkProfile
from testbed.remote import ssh

log = logging.getLogger(__name__)

DEFAULT_ROOTS = {"noqueue", "pfifo_fast", "mq", "fq_codel", "fq", "pfifo", "bfifo", "sfq",
                 "cake", "multiq"}
FILTER_PRIO = "1"
# Reading back needs no root, but a non-root login's PATH lacks /usr/sbin (Debian, Ubuntu):
# reads name tc by the path the sshaccess role's sudo rule names too.
TC_PATH = "/usr/sbin/tc"


def read_argv(argv: list[str]) -> list[str]:
    """A ``tc … show`` argv with tc by its full path."""
    return [TC_PATH, *argv[1:]]
RATE_TOLERANCE = 0.01  # tc stores rates in bytes/s, rounded


def minor(dc_position: int) -> str:
    """The htb class minor (hex, as tc prints it) of the DC at this topology position."""
    return f"{0x10 + dc_position:x}"


def needs_netem(p: LinkProfile) -> bool:
    return (p.one_way_delay_ms > 0 or p.jitter_ms > 0 or p.loss_pct > 0
            or p.loss_model == "gilbert_elliott")


def shaped(p: LinkProfile) -> bool:
    return bool(p.rate_mbit) or needs_netem(p)


@dataclass
class Route:
    """Traffic from one host towards one destination DC, and how it is to be shaped."""

    peer: str
    minor: str
    subnets: list[ipaddress.IPv4Network]
    profile: LinkProfile


def _htb_class(dev: str, m: str, rate_mbit: float, verb: str) -> list[str]:
    rate, burst = f"{rate_mbit:g}mbit", str(tc.burst_bytes(rate_mbit))
    return ["tc", "class", verb, "dev", dev, "parent", "1:", "classid", f"1:{m}", "htb",
            "rate", rate, "ceil", rate, "burst", burst, "cburst", burst,
            "quantum", str(tc.HTB_QUANTUM)]


def leaf_argvs(dev: str, r: Route, verb: str = "add") -> list[list[str]]:
    """The class and leaf qdisc(s) of one destination."""
    p, m = r.profile, r.minor
    if needs_netem(p):
        out = [_htb_class(dev, m, tc.UNSHAPED_RATE_MBIT, verb),
               ["tc", "qdisc", verb, "dev", dev, "parent", f"1:{m}", "handle", f"{m}00:",
                "netem", *tc.netem_args(p)]]
        if p.rate_mbit:
            out.append(["tc", "qdisc", verb, "dev", dev, "parent", f"{m}00:1", "handle",
                        f"{m}01:", "tbf", "rate", f"{p.rate_mbit:g}mbit",
                        "burst", str(tc.burst_bytes(p.rate_mbit)),
                        "limit", str(p.queue_limit_bytes())])
        return out
    return [_htb_class(dev, m, p.rate_mbit, verb),
            ["tc", "qdisc", verb, "dev", dev, "parent", f"1:{m}", "handle", f"{m}00:",
             "bfifo", "limit", str(p.queue_limit_bytes())]]


def filter_argvs(dev: str, r: Route) -> list[list[str]]:
    return [["tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip",
             "prio", FILTER_PRIO, "u32", "match", "ip", "dst", str(net), "flowid", f"1:{r.minor}"]
            for net in r.subnets]


def host_argvs(dev: str, routes: list[Route]) -> list[list[str]]:
    """Every tc argv that shapes ``dev`` for ``routes`` (root htb first); empty when none of
    them is shaped."""
    routes = [r for r in routes if shaped(r.profile)]
    if not routes:
        return []
    out = [["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "0"]]
    for r in routes:
        out += leaf_argvs(dev, r) + filter_argvs(dev, r)
    return out


SHOW_FILTER = ["tc", "filter", "show", "dev"]
_FLOWID_RE = re.compile(r"\bflowid (\S+)")
_MATCH_RE = re.compile(r"^match ([0-9a-f]{8})/([0-9a-f]{8}) at 16$")


def parse_u32(text: str) -> set[tuple[str, str]]:
    """``tc filter show`` u32 output as {(flowid, destination subnet)}."""
    out, flow = set(), None
    for line in text.splitlines():
        line = line.strip()
        m = _FLOWID_RE.search(line)
        if line.startswith("filter"):
            flow = m.group(1) if m else None
            continue
        mm = _MATCH_RE.match(line)
        if mm and flow:
            addr = ipaddress.IPv4Address(int(mm.group(1), 16))
            plen = bin(int(mm.group(2), 16)).count("1")
            out.add((flow, str(ipaddress.ip_network(f"{addr}/{plen}"))))
    return out


def _rate_ok(got, want_mbit: float) -> bool:
    want = want_mbit * 1e6 / 8
    return got is not None and abs(float(got) - want) <= RATE_TOLERANCE * want


def check(routes: list[Route], qdiscs: list[dict], classes: list[dict],
          filters: set[tuple[str, str]]) -> list[tc.Mismatch]:
    """Mismatches between a NIC's read-back state and ``routes``."""
    by_handle = {q.get("handle", ""): q for q in qdiscs}
    cls = {c["handle"]: c for c in classes}
    routes = [r for r in routes if shaped(r.profile)]
    if not routes:
        return []
    out = []
    if by_handle.get("1:", {}).get("kind") != "htb":
        out.append(tc.Mismatch("root qdisc", "htb 1:", by_handle.get("1:", {}).get("kind")))
    for r in routes:
        out += _check_route(r, by_handle, cls, filters)
    return out


def _check_route(r: Route, q: dict, cls: dict, filters: set) -> list[tc.Mismatch]:
    p, m, out = r.profile, r.minor, []
    leaf = q.get(f"{m}00:", {})
    if needs_netem(p):
        out += tc.check_netem_leaf(p, leaf, q.get(f"{m}01:"), where=f"to {r.peer}: ")
    else:
        if not _rate_ok(cls.get(f"1:{m}", {}).get("rate"), p.rate_mbit):
            out.append(tc.Mismatch(f"to {r.peer}: htb rate (Mbit/s)", p.rate_mbit,
                                   cls.get(f"1:{m}")))
        limit = leaf.get("options", {}).get("limit")
        if leaf.get("kind") != "bfifo" or limit != p.queue_limit_bytes():
            out.append(tc.Mismatch(f"to {r.peer}: queue", f"bfifo {p.queue_limit_bytes()}",
                                   f"{leaf.get('kind')} {limit}"))
    for net in r.subnets:
        if (f"1:{m}", str(net)) not in filters:
            out.append(tc.Mismatch(f"to {r.peer}: filter", f"dst {net} → 1:{m}", "missing"))
    return out


def read_nic(conn, host) -> tuple[list[dict], list[dict], set]:
    """A host NIC's qdiscs, htb classes and u32 filters, read without privileges."""
    dev = host.iface
    q = tc.parse_json(ssh.run(conn, host, read_argv(tc.SHOW_QDISC + [dev])).stdout)
    c = tc.parse_classes(ssh.run(conn, host, read_argv(tc.SHOW_CLASS + [dev])).stdout)
    f = parse_u32(ssh.run(conn, host, read_argv(SHOW_FILTER + [dev])).stdout)
    return q, c, f


@dataclass
class HostShaping:
    """One host's NIC and the destinations shaped on it."""

    host: object          # LabHost
    routes: list[Route]
    applied: bool = False


@dataclass
class RemoteShaper(Shaper):
    """Shapes every lab host's NIC; the Shaper face the runner uses (apply, verify, update,
    drops, queue_drops, stop). ``name`` is ``netem`` or ``htb`` (rate only)."""

    lab: object           # testbed.remote.lab.Lab
    plan: list[HostShaping]
    name: str = "htb"
    directions: list = field(default_factory=list)
    lab_links: list = field(default_factory=list)   # the network's ResolvedLinks

    def apply(self) -> "RemoteShaper":
        """Check every host can take its shaping, shape all of them in parallel, read it all
        back. Raises ShapingError (or RemoteError listing hosts) and removes what was set."""
        self._refuse_without_netem()
        try:
            self._each("shaping", self._shape)
            self.verify()
        except BaseException as e:
            try:
                self.stop()
            except TestbedError as undo:  # keep the first cause; say what was left behind
                e.add_note(f"and removing the shaping failed: {undo}")
            raise
        return self

    def _refuse_without_netem(self) -> None:
        bad = {hs.host.name: ", ".join(r.peer for r in hs.routes if needs_netem(r.profile))
               for hs in self.plan if not self.lab.netem.get(hs.host.name)}
        bad = {k: v for k, v in bad.items() if v}
        if bad:
            raise ShapingError(
                "delay, jitter or loss needs netem, which these hosts' kernels lack (nothing "
                "was applied; rate-only shaping works without it): "
                + "; ".join(f"{h} (towards {p})" for h, p in sorted(bad.items())))

    def _each(self, step: str, fn) -> dict:
        hosts = {hs.host.name: hs for hs in self.plan}
        return self.lab.each(lambda h, c: fn(hosts[h.name], c), step,
                             [hs.host for hs in self.plan])

    def _shape(self, hs: HostShaping, conn) -> None:
        argvs = host_argvs(hs.host.iface, hs.routes)
        if not argvs:
            return
        root = self._root(hs, conn)
        if root not in DEFAULT_ROOTS:
            raise ShapingError(
                f"{hs.host.iface} already has a {root} root qdisc (not a kernel default): "
                f"testbed leaves other shaping alone; remove it with `tc qdisc del dev "
                f"{hs.host.iface} root` if it is a leftover")
        hs.applied = True
        for argv in argvs:
            try:
                ssh.run(conn, hs.host, argv, privileged=True)
            except CommandError as e:
                if "qdisc kind is unknown" in e.output:
                    raise ShapingError(f"{hs.host.name}: the kernel lacks the qdisc in "
                                       f"{' '.join(argv)} (netem?)") from None
                raise ShapingError(f"{hs.host.name}: {' '.join(argv)}: "
                                   f"{e.output.strip()}") from None

    def _root(self, hs: HostShaping, conn) -> str:
        qd = tc.parse_json(ssh.run(conn, hs.host,
                                   read_argv(tc.SHOW_QDISC + [hs.host.iface])).stdout)
        root = next((q for q in qd if q.get("root")), {})
        return root.get("kind", "noqueue")

    def _read(self, hs: HostShaping, conn) -> tuple[list[dict], list[dict], set]:
        return read_nic(conn, hs.host)

    def verify(self) -> None:
        """Read every host's NIC back; ShapingError naming every difference."""
        found = self._each("reading shaping back",
                           lambda hs, c: [f"{hs.host.name} {hs.host.iface}: {m}" for m in
                                          check(hs.routes, *self._read(hs, c))])
        problems = [p for ps in found.values() for p in ps]
        if problems:
            raise ShapingError("shaping is not what was asked for:\n  " + "\n  ".join(problems))

    def update(self, link_index: int, a_to_b: LinkProfile, b_to_a: LinkProfile) -> None:
        """A time-varying step: reshape the hosts of the link's two DCs and verify (the NIC's
        qdiscs are rebuilt, so packets queued at that instant are dropped)."""
        links = {lk.index: lk for lk in self.lab_links}
        lk = links[link_index]
        touched = []
        for hs in self.plan:
            for r in hs.routes:
                if {hs.host.dc, r.peer} == {lk.a, lk.b}:
                    r.profile = a_to_b if hs.host.dc == lk.a else b_to_a
                    touched.append(hs)
        self._refuse_without_netem()
        for hs in touched:
            self._remove(hs, self.lab.conns[hs.host.name])
            self._shape(hs, self.lab.conns[hs.host.name])
        self.verify()

    def check_alive(self) -> None:
        """Nothing to poll: kernel qdiscs only; ``verify`` re-reads them after the run."""

    def drops(self) -> int | None:
        """None: nothing here measures the emulator's own drops apart from the others."""
        return None

    def queue_drops(self) -> int:
        """Packets each destination's leaf dropped, all hosts: the ``m00:`` qdisc, a bfifo
        (congestion) or a netem (its loss, its limit, and its tbf child's drops, which netem
        counts again, so no child is added)."""
        got = self._each("reading drops", lambda hs, c: sum(
            int(q.get("drops", 0)) for q in self._read(hs, c)[0]
            if q.get("handle", "").endswith("00:")))
        return sum(got.values())

    def _remove(self, hs: HostShaping, conn) -> None:
        """Delete the NIC's root qdisc (ours: htb) and check it is gone. Raises ShapingError
        when it stays: the lab NIC would otherwise stay throttled."""
        if hs.applied and self._root(hs, conn) == "htb":
            try:
                ssh.run(conn, hs.host, tc.delete_root_argv(hs.host.iface), privileged=True)
            except CommandError as e:
                raise ShapingError(f"{hs.host.name}: could not remove the shaping of "
                                   f"{hs.host.iface} (it stays throttled): "
                                   f"{e.output.strip()}") from None
            if self._root(hs, conn) == "htb":
                raise ShapingError(f"{hs.host.name}: {hs.host.iface} still has testbed's htb "
                                   "root after deleting it")
        hs.applied = False

    def stop(self) -> None:
        """Remove the shaping from every host it was applied to (idempotent)."""
        todo = [hs for hs in self.plan if hs.applied]
        if todo:
            self.lab.each(lambda h, c: self._remove(next(x for x in todo if x.host is h), c),
                          "removing shaping", [hs.host for hs in todo])
