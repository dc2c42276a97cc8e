"""Shapers: give every link direction of a built Network its LinkProfile, read it back, and
change it while a run goes on (time-varying steps).

- ``netem``: tc netem (+ tbf) on each router's sending interface (and on host links for intra-DC
  profiles). For kernels that have ``sch_netem``.
- ``delayline``: rate and queue in the kernel (htb + bfifo), Bernoulli loss in the kernel
  (iptables ``statistic``), delay, jitter and Gilbert–Elliott loss in one userspace delay-line
  process per direction, fed by an NFQUEUE rule in the FORWARD chain of the sending router.

Every iptables rule carries the run tag as a comment; every process is in the ledger; all of it
lives in the run's namespaces.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from testbed.errors import CommandError, MachineError, ShapingError, writing
from testbed.net.network import LinkEnd, Network
from testbed.net.ledger import stop_pids
from testbed.net.shaping import tc
from testbed.net.shaping.interface import Shaper
from testbed.net.shaping.nfqueue import check_rules, queue_table
from testbed.probe import kernel_has_netem
from testbed.topology import LinkProfile

log = logging.getLogger(__name__)

DELAYLINE_START_TIMEOUT_S = 10.0


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


def _run_all(net: Network, node, argvs: list[list[str]]) -> None:
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


def _qdiscs(net: Network, node, dev: str) -> tuple[list[dict], list[dict]]:
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
            q, _ = _qdiscs(self.net, d.end.router, d.end.iface)
            return tc.drops(q, self.drops_handle)
        return sum(_each(dropped, self.directions))

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
                    _run_all(self.net, n, self._intra_argvs(iface, p))
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
        q, c = _qdiscs(self.net, node, dev)
        return tc.check_rate(p, q, c)

    def _change(self, d: Direction) -> None: ...

    def _check(self, d: Direction) -> list: ...


class NetemShaper(NamespaceShaper):
    """``queue_drops`` is netem's own counter (``1:``): its configured loss, its limit
    overflowing, and every drop of its tbf child (netem counts a child's drop again), so it is
    each direction's total; tbf's share alone is in its own counter (``10:``)."""

    name = "netem"
    drops_handle = "1:"

    def _shape(self, d: Direction) -> None:
        _run_all(self.net, d.end.router, tc.netem_argvs(d.end.iface, d.profile))

    def _change(self, d: Direction) -> None:
        _run_all(self.net, d.end.router, tc.netem_argvs(d.end.iface, d.profile, verb="change"))

    def _check(self, d: Direction) -> list:
        return self._check_dev(d.end.router, d.end.iface, d.profile)

    def _check_dev(self, node, dev: str, p: LinkProfile) -> list:
        q, _ = _qdiscs(self.net, node, dev)
        return tc.check_netem(p, q)

    def _intra_argvs(self, dev: str, p: LinkProfile) -> list[list[str]]:
        return tc.netem_argvs(dev, p)


class DelayLineShaper(NamespaceShaper):
    """``queue_drops`` is the bfifo leaf's counter (``10:``: congestion at the rate limit);
    Bernoulli loss is dropped by iptables and the delay line's own drops are ``drops``."""

    name = "delayline"

    def check_alive(self) -> None:
        dead = [f"{d.label} (link {d.end.link.name}, exit {d.proc.returncode})"
                for d in self.directions if d.proc is not None and d.proc.poll() is not None]
        if dead:
            raise ShapingError("delay line died during the run: " + ", ".join(dead))

    def _check_intra(self) -> None:
        for dc in self.net.topology.dcs:
            if self._intra_needs_delay(dc.intra):
                raise ShapingError(
                    f"DC {dc.name}: intra-DC delay, jitter or loss needs netem, which this kernel "
                    "lacks; the delay line shapes inter-DC links only (intra-DC rate is fine)")

    def _shape(self, d: Direction) -> None:
        node, dev = d.end.router, d.end.iface
        _run_all(self.net, node, tc.rate_argvs(dev, d.profile))
        d.queue = 2 * d.end.link.index + (0 if d.end.router.dc == d.end.link.a else 1)
        self._set_rules(d)
        # A process even at 0 ms: a step may add delay later, and its overhead is measured.
        self._start(d)

    def _rule_specs(self, d: Direction) -> list[list[str]]:
        """The FORWARD rules of one direction: optional Bernoulli DROP, then the NFQUEUE."""
        base = ["FORWARD", "-o", d.end.iface, "-m", "comment", "--comment", self.net.tag]
        p, out = d.profile, []
        if p.loss_model == "bernoulli" and p.loss_pct > 0:
            out.append(base + ["-m", "statistic", "--mode", "random",
                               "--probability", f"{p.loss_pct / 100:.6g}", "-j", "DROP"])
        return out + [base + ["-j", "NFQUEUE", "--queue-num", str(d.queue)]]

    def _set_rules(self, d: Direction) -> None:
        """Replace this direction's rules (delete the old ones, append the new ones)."""
        node = d.end.router
        _run_all(self.net, node, [["iptables", "-w", "-D", *r] for r in d.rules])
        d.rules = self._rule_specs(d)
        _run_all(self.net, node, [["iptables", "-w", "-A", *r] for r in d.rules])

    def _config(self, d: Direction) -> dict:
        p = d.profile
        ge = p.gilbert_elliott.model_dump() if (p.loss_model == "gilbert_elliott"
                                                and p.gilbert_elliott) else None
        return {"delay_ms": p.one_way_delay_ms, "jitter_ms": p.jitter_ms,
                "jitter_distribution": p.jitter_distribution.value, "gilbert_elliott": ge}

    def _write_config(self, d: Direction) -> None:
        tmp = d.config.with_suffix(".tmp")
        with writing(d.config):
            tmp.write_text(json.dumps(self._config(d)))
            os.replace(tmp, d.config)

    def _start(self, d: Direction) -> None:
        with writing(self.workdir, "create"):
            self.workdir.mkdir(parents=True, exist_ok=True)
        stem = f"delayline-{d.end.router.dc}-{d.end.peer}"
        d.config, d.stats = self.workdir / f"{stem}.json", self.workdir / f"{stem}.stats.json"
        d.stats.unlink(missing_ok=True)
        self._write_config(d)
        log_path = self.workdir / f"{stem}.log"
        with writing(log_path, "create"):
            logf = open(log_path, "wb")
        with logf:
            d.proc = self.net.popen(d.end.router, [
                sys.executable, "-m", "testbed.net.shaping.delayline", "--queue", str(d.queue),
                "--config", str(d.config), "--stats", str(d.stats),
                "--seed", str(d.queue)], stdout=logf, stderr=logf)
        deadline = time.monotonic() + DELAYLINE_START_TIMEOUT_S
        while not d.stats.exists():
            if d.proc.poll() is not None or time.monotonic() > deadline:
                raise ShapingError(f"delay line {d.label} did not start: "
                                   f"{log_path.read_text(errors='replace').strip()[-500:]}")
            time.sleep(0.01)

    def _change(self, d: Direction) -> None:
        node, dev = d.end.router, d.end.iface
        q, _ = _qdiscs(self.net, node, dev)
        had_rate = any(x.get("handle") == "1:" and x.get("kind") == "htb" for x in q)
        if d.profile.rate_mbit:
            _run_all(self.net, node, tc.rate_argvs(dev, d.profile,
                                                   verb="change" if had_rate else "replace"))
        elif had_rate:
            _run_all(self.net, node, [tc.delete_root_argv(dev)])
        self._set_rules(d)
        loads = self._stats(d).get("config_loads", 0)
        self._write_config(d)
        d.proc.send_signal(signal.SIGHUP)
        self._wait_reload(d, loads)

    def _wait_reload(self, d: Direction, loads: int) -> None:
        """Wait for the delay line to report a load after ``loads``. Raises ShapingError when
        it exits first or takes over DELAYLINE_START_TIMEOUT_S (the step is then not applied)."""
        deadline = time.monotonic() + DELAYLINE_START_TIMEOUT_S
        while self._stats(d).get("config_loads", 0) <= loads:
            if d.proc.poll() is not None:
                raise ShapingError(f"delay line {d.label} exited ({d.proc.returncode}) before "
                                   "loading its new config")
            if time.monotonic() > deadline:
                raise ShapingError(f"delay line {d.label} did not load its new config within "
                                   f"{DELAYLINE_START_TIMEOUT_S:g} s")
            time.sleep(0.01)

    @staticmethod
    def _stats(d: Direction) -> dict:
        try:
            return json.loads(d.stats.read_text())
        except (OSError, ValueError):
            return {}

    def _check(self, d: Direction) -> list:
        out = self._check_dev(d.end.router, d.end.iface, d.profile)
        rules = self.net.run(d.end.router, ["iptables", "-w", "-S", "FORWARD"]).stdout
        out += check_rules(rules, d.end.iface, self.net.tag, d.queue, d.profile)
        if d.proc is not None and d.proc.poll() is not None:
            out.append(tc.Mismatch("delay-line process", "running",
                                   f"exited {d.proc.returncode}"))
        loaded = self._stats(d).get("config")
        if loaded != self._config(d):
            out.append(tc.Mismatch("delay-line config in force", self._config(d), loaded))
        bound = queue_table(self.net, d.end.router).get(d.queue)
        if bound is None:
            out.append(tc.Mismatch("NFQUEUE", f"queue {d.queue} bound", "not bound"))
        return out

    def drops(self) -> int:
        """Packets the kernel dropped because a delay line's queue was full or it fell behind
        (``queue_dropped`` + ``user_dropped`` of /proc/net/netfilter/nfnetlink_queue)."""
        total = 0
        for router in {d.end.router for d in self.directions}:
            for row in queue_table(self.net, router).values():
                total += row["queue_dropped"] + row["user_dropped"]
        return total

    def stats(self) -> dict[str, dict]:
        """Per-direction statistics the delay-line processes wrote."""
        return {d.label: self._stats(d) for d in self.directions if d.stats}

    def stop(self) -> None:
        stop_pids([d.proc.pid for d in self.directions if d.proc is not None])
        for d in self.directions:
            if d.proc is not None:
                d.proc.wait()


SHAPERS: dict[str, type[NamespaceShaper]] = {"netem": NetemShaper, "delayline": DelayLineShaper}


def choose_shaper(requested: str, netem_ok: bool | None = None) -> tuple[str, str]:
    """Resolve ``auto`` (netem where the kernel has it) and check an explicit choice.
    Returns (name, reason); raises MachineError when netem is asked for but missing."""

    has = kernel_has_netem() if netem_ok is None else netem_ok
    if requested == "netem" and not has:
        raise MachineError("shaper netem: this kernel has no sch_netem",
                           "use shaper: delayline (or auto), or a kernel with CONFIG_NET_SCH_NETEM")
    if requested == "auto":
        return ("netem", "auto: the kernel has netem") if has else \
            ("delayline", "auto: the kernel has no netem, so delay comes from the userspace "
                          "delay line")
    return requested, "asked for in the experiment"
