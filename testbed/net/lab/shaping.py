"""Inter-DC shaping on lab hosts: each host's NIC shaped over SSH as ``testbed.net.lab.nic``
lays it out, read back, removed afterwards.

Before shaping, the NIC's root qdisc must be a kernel default (noqueue, pfifo_fast, mq,
fq_codel, fq…): anything else is someone's shaping and is left alone (the cell fails saying
how to remove it). Removal deletes the root qdisc, which gives the NIC its default back.
A host without sch_netem gets rate-only shaping; asking it for delay fails before anything is
applied. Each host's NIC is its own bottleneck: with several hosts per DC, a link's rate is per
host pair, not shared by the DC as on the emulated router (see docs/howto/lab.md).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from testbed.errors import CommandError, ShapingError, TestbedError
from testbed.net.lab import ssh
from testbed.net.lab.nic import (SHOW_FILTER, Route, check, host_argvs, needs_netem, parse_u32,
                                 read_argv)
from testbed.net.shaping import tc
from testbed.net.shaping.interface import Shaper
from testbed.topology import LinkProfile

log = logging.getLogger(__name__)

DEFAULT_ROOTS = {"noqueue", "pfifo_fast", "mq", "fq_codel", "fq", "pfifo", "bfifo", "sfq",
                 "cake", "multiq"}


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

    lab: object           # testbed.net.lab.lab.Lab
    plan: list[HostShaping]
    name: str = "htb"
    directions: list = field(default_factory=list)
    lab_links: list = field(default_factory=list)   # the network's ResolvedLinks
    # told (host name, NIC) before a NIC whose root was a kernel default is shaped
    on_shaped: Callable[[str, str], None] | None = None

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
        if self.on_shaped is not None:
            self.on_shaped(hs.host.name, hs.host.iface)
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
