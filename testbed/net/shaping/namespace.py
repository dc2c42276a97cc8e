"""The common life of the shapers that run in this machine's router namespaces (``netem`` and
``delayline``, ``testbed.net.shaping.shapers``): every link direction of a built Network (and
each host link, for intra-DC profiles) given its LinkProfile, read back in threads, changed
while a run goes on; subclasses say how one direction is shaped and checked.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from testbed.errors import CommandError, ShapingError
from testbed.net.network import LinkEnd, Network
from testbed.net.shaping import tc
from testbed.net.shaping.interface import Sent, Shaper
from testbed.topology import LinkProfile


@dataclass
class Direction:
    """One shaped direction: the sending end of a link and the profile it has now."""

    end: LinkEnd
    profile: LinkProfile
    queue: int = -1
    proc: object = None
    config: Path | None = None
    stats: Path | None = None
    rules: list[list[str]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.end.router.dc}->{self.end.peer}"


def _direction_profiles(net: Network) -> list[tuple[LinkEnd, LinkProfile]]:
    out = []
    for link in net.links:
        a, b = net.ends_of(link)
        out += [(a, link.a_to_b), (b, link.b_to_a)]
    return out


def run_all(net: Network, node, argvs: list[list[str]]) -> None:
    for argv in argvs:
        try:
            net.run(node, argv)
        except CommandError as e:
            raise ShapingError(f"tc on {node.name} failed: {' '.join(argv)}: {e.output.strip()}")


# Reading back runs a few `tc`/`iptables` commands per direction (each a process entering a
# namespace, a few ms); 4 DCs have 12 directions, read before and after every cell: in threads
READ_BACK_THREADS = 8


def _each(fn, directions: list) -> list:
    """``fn`` of every direction, in order, run in threads (each mostly waits for a process)."""
    with ThreadPoolExecutor(READ_BACK_THREADS) as pool:
        return list(pool.map(fn, directions))


def read_qdiscs(net: Network, node, dev: str) -> tuple[list[dict], list[dict]]:
    q = tc.parse_json(net.run(node, tc.SHOW_QDISC + [dev]).stdout)
    c = tc.parse_classes(net.run(node, tc.SHOW_CLASS + [dev]).stdout)
    return q, c


@dataclass
class NamespaceShaper(Shaper):
    """Common life of the shapers that run in this machine's router namespaces; subclasses say
    how one direction is shaped and checked."""

    net: Network
    workdir: Path
    directions: list[Direction] = field(default_factory=list)
    name = "base"
    drops_handle = "10:"  # the qdisc whose drop counter queue_drops reports

    def apply(self) -> "NamespaceShaper":
        """Shape every inter-DC direction and every host link, then read all of it back.
        Raises ShapingError naming every mismatch."""
        self._check_intra()
        for end, profile in _direction_profiles(self.net):
            d = Direction(end, profile)
            self.directions.append(d)
            self._shape(d)
        self._shape_intra()
        self.verify()
        return self

    def verify(self) -> None:
        problems = [f"{d.label}: {m}" for d, found in zip(self.directions,
                                                          _each(self._check, self.directions))
                    for m in found]
        if problems:
            raise ShapingError("shaping is not what was asked for:\n  " + "\n  ".join(problems))

    def update(self, link_index: int, a_to_b: LinkProfile, b_to_a: LinkProfile) -> None:
        """Change a link's profile in place (a time-varying step) and verify it."""
        for d in self.directions:
            if d.end.link.index == link_index:
                d.profile = a_to_b if d.end.router.dc == d.end.link.a else b_to_a
                self._change(d)
                bad = self._check(d)
                if bad:
                    raise ShapingError(f"{d.label} after step: " + "; ".join(map(str, bad)))

    def in_force(self, link_index: int) -> tuple[LinkProfile, LinkProfile]:
        """(a→b, b→a) profiles the link has now (after any step)."""
        a, b = (d.profile for d in sorted(
            (d for d in self.directions if d.end.link.index == link_index),
            key=lambda d: d.end.router.dc != d.end.link.a))
        return a, b

    def check_alive(self) -> None:
        """Cheap check, polled while workers run: raises ShapingError naming the link direction
        whose shaping died (a delay-line process). Nothing to poll for kernel-only shaping;
        ``verify`` re-reads everything once the workers are done."""

    def drops(self) -> int | None:
        """Packets dropped by the emulator itself (not by configured loss or the queue); None
        where nothing measures that apart from other drops (netem: see ``queue_drops``)."""
        return None

    def queue_drops(self) -> int:
        """Packets the shaping qdiscs dropped, summed over directions (see ``QUEUE_DROPS``)."""
        def dropped(d: Direction) -> int:
            q, _ = read_qdiscs(self.net, d.end.router, d.end.iface)
            return tc.drops(q, self.drops_handle)
        return sum(_each(dropped, self.directions))

    def tx_counters(self) -> dict[str, Sent]:
        """The ``tx_bytes`` and ``tx_packets`` counters of every direction's sending router
        interface."""
        def sent(d: Direction) -> Sent:
            out = self.net.run(d.end.router, ["ip", "-s", "-j", "link", "show", "dev",
                                              d.end.iface]).stdout
            tx = json.loads(out)[0]["stats64"]["tx"]
            return Sent(int(tx["bytes"]), int(tx["packets"]))
        return {f"{d.end.router.dc}->{d.end.peer}": n
                for d, n in zip(self.directions, _each(sent, self.directions))}

    def counter_namespaces(self) -> dict[str, tuple[str, str]]:
        out = {}
        for d in self.directions:
            ns = self.net.backend.netns_file(d.end.router)
            if ns is None:
                return {}
            out[f"{d.end.router.dc}->{d.end.peer}"] = (ns, d.end.iface)
        return out

    def stop(self) -> None:
        """Stop anything the shaper runs (qdiscs and rules go with the namespaces)."""

    # intra-DC links: rate on both ends of each host's link, delay only with netem
    def _check_intra(self) -> None:
        return None

    def _shape_intra(self) -> None:
        for (dc, j), host in self.net.hosts.items():
            p = self.net.topology.dc(dc).intra
            if p.rate_mbit or self._intra_needs_delay(p):
                node, dev = self.net.backend.host_port(self.net, dc, j)
                for n, iface in ((host, "eth0"), (node, dev)):
                    run_all(self.net, n, self._intra_argvs(iface, p))
                    bad = self._check_dev(n, iface, p)
                    if bad:
                        raise ShapingError(f"intra-DC link of {host.name} ({iface}): "
                                           + "; ".join(map(str, bad)))

    @staticmethod
    def _intra_needs_delay(p: LinkProfile) -> bool:
        return p.one_way_delay_ms > 0 or p.jitter_ms > 0 or p.loss_pct > 0 or \
            p.loss_model == "gilbert_elliott"

    def _intra_argvs(self, dev: str, p: LinkProfile) -> list[list[str]]:
        return tc.rate_argvs(dev, p)

    def _shape(self, d: Direction) -> None: ...

    def _check_dev(self, node, dev: str, p: LinkProfile) -> list:
        """Mismatches between a device's qdiscs and the profile."""
        q, c = read_qdiscs(self.net, node, dev)
        return tc.check_rate(p, q, c)

    def _change(self, d: Direction) -> None: ...

    def _check(self, d: Direction) -> list: ...
