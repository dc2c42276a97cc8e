"""One lab host NIC's tc, as data: the argv that shape it per destination DC and what its
read-back must show. Nothing here runs a command (``testbed.net.lab.shaping`` runs them over
SSH).

One NIC per host carries the traffic to every other DC, so each destination DC gets its own
htb class, selected by u32 filters on the destination DC's subnets; unclassified traffic (the
host's own DC, SSH) goes to htb's direct queue, unshaped. Per destination DC with minor m
(``0x10 +`` the DC's position in the topology):

- delay, jitter or loss wanted (needs netem): ``class 1:m htb`` at the unshaped rate (it only
  classifies), ``m00: netem …`` as its leaf, and with a rate ``parent m00:1 m01: tbf`` for rate
  and queue, as ``testbed.net.shaping.tc`` lays out netem on a single link;
- rate only: ``class 1:m htb rate R ceil R`` with a ``m00: bfifo`` leaf holding the queue;
- neither: no class, no filter.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from testbed.net.shaping import tc
from testbed.topology import LinkProfile

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
