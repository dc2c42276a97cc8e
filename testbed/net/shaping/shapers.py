"""The shapers of this machine's router namespaces (their common life: ``namespace``), and
the choice between them:

- ``netem``: tc netem (+ tbf) on each router's sending interface (and on host links for intra-DC
  profiles). For kernels that have ``sch_netem``.
- ``delayline``: rate and queue in the kernel (htb + bfifo), Bernoulli loss in the kernel
  (iptables ``statistic``), delay, jitter and Gilbert–Elliott loss in one userspace delay-line
  process per direction (``testbed.net.shaping.delayline``), fed by an NFQUEUE rule in the
  FORWARD chain of the sending router.

Every iptables rule carries the run tag as a comment; every process is in the ledger; all of it
lives in the run's namespaces.
"""
from __future__ import annotations

import json
import logging
import signal
import sys
import time

from testbed.errors import MachineError, ShapingError, writing
from testbed.net.shaping import tc
from testbed.net.shaping.namespace import Direction, NamespaceShaper, read_qdiscs, run_all
from testbed.net.shaping.nfqueue import check_rules, queue_table
from testbed.probe import kernel_has_netem
from testbed.process import describe_exit, stop_processes
from testbed.topology import LinkProfile

log = logging.getLogger(__name__)

DELAYLINE_START_TIMEOUT_S = 10.0
# How long ``releases`` waits for the delay lines' fresh statistics: an idle one wakes every
# 50 ms (IDLE_WAIT_S), a busy one at each packet and release.
STATS_WAIT_S = 1.0


class NetemShaper(NamespaceShaper):
    """``queue_drops`` is netem's own counter (``1:``): its configured loss, its limit
    overflowing, and every drop of its tbf child (netem counts a child's drop again), so it is
    each direction's total; tbf's share alone is in its own counter (``10:``)."""

    name = "netem"
    drops_handle = "1:"

    def _shape(self, d: Direction) -> None:
        run_all(self.net, d.end.router, tc.netem_argvs(d.end.iface, d.profile))

    def _change(self, d: Direction) -> None:
        run_all(self.net, d.end.router, tc.netem_argvs(d.end.iface, d.profile, verb="change"))

    def _check(self, d: Direction) -> list:
        return self._check_dev(d.end.router, d.end.iface, d.profile)

    def _check_dev(self, node, dev: str, p: LinkProfile) -> list:
        q, _ = read_qdiscs(self.net, node, dev)
        return tc.check_netem(p, q)

    def _intra_argvs(self, dev: str, p: LinkProfile) -> list[list[str]]:
        return tc.netem_argvs(dev, p)


class DelayLineShaper(NamespaceShaper):
    """``queue_drops`` is the bfifo leaf's counter (``10:``: congestion at the rate limit);
    Bernoulli loss is dropped by iptables and the delay line's own drops are ``drops``."""

    name = "delayline"

    def check_alive(self) -> None:
        dead = [self._death(d) for d in self.directions
                if d.proc is not None and d.proc.poll() is not None]
        if dead:
            raise ShapingError("; ".join(dead))

    @staticmethod
    def _death(d: Direction) -> str:
        """How a direction's delay line ended, naming the direction, its link and its pid."""
        return (f"the delay line for {d.label} (link {d.end.link.name}, pid {d.proc.pid}) "
                f"{describe_exit(d.proc.returncode)}")

    def _check_intra(self) -> None:
        for dc in self.net.topology.dcs:
            if self._intra_needs_delay(dc.intra):
                raise ShapingError(
                    f"DC {dc.name}: intra-DC delay, jitter or loss needs netem, which this kernel "
                    "lacks; the delay line shapes inter-DC links only (intra-DC rate is fine)")

    def _shape(self, d: Direction) -> None:
        node, dev = d.end.router, d.end.iface
        run_all(self.net, node, tc.rate_argvs(dev, d.profile))
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
        run_all(self.net, node, [["iptables", "-w", "-D", *r] for r in d.rules])
        d.rules = self._rule_specs(d)
        run_all(self.net, node, [["iptables", "-w", "-A", *r] for r in d.rules])

    def _config(self, d: Direction) -> dict:
        p = d.profile
        ge = p.gilbert_elliott.model_dump() if (p.loss_model == "gilbert_elliott"
                                                and p.gilbert_elliott) else None
        return {"delay_ms": p.one_way_delay_ms, "jitter_ms": p.jitter_ms,
                "jitter_distribution": p.jitter_distribution.value, "gilbert_elliott": ge}

    def _write_config(self, d: Direction) -> None:
        self.net.write_text(d.end.router, d.config, json.dumps(self._config(d)))

    def _start(self, d: Direction) -> None:
        with writing(self.workdir, "create"):
            self.workdir.mkdir(parents=True, exist_ok=True)
        stem = f"delayline-{d.end.router.dc}-{d.end.peer}"
        there = self.net.files_dir(d.end.router, self.workdir)  # where its router sees files
        d.config, d.stats = there / f"{stem}.json", there / f"{stem}.stats.json"
        self.net.write_text(d.end.router, d.stats, "")  # a stale one would read as started
        self._write_config(d)
        log_path = self.workdir / f"{stem}.log"
        with writing(log_path, "create"):
            logf = open(log_path, "wb")
        with logf:
            d.proc = self.net.popen(d.end.router, [
                sys.executable, "-m", "testbed.net.shaping.delayline", "--queue", str(d.queue),
                "--config", str(d.config), "--stats", str(d.stats),
                "--seed", str(d.queue)], stdout=logf, stderr=logf)
        log.info("delay line %s (link %s) started (pid %s)", d.label, d.end.link.name,
                 d.proc.pid)
        deadline = time.monotonic() + DELAYLINE_START_TIMEOUT_S
        while not self._stats(d):
            if d.proc.poll() is not None or time.monotonic() > deadline:
                raise ShapingError(f"delay line {d.label} did not start: "
                                   f"{log_path.read_text(errors='replace').strip()[-500:]}")
            time.sleep(0.01)

    def _change(self, d: Direction) -> None:
        node, dev = d.end.router, d.end.iface
        q, _ = read_qdiscs(self.net, node, dev)
        had_rate = any(x.get("handle") == "1:" and x.get("kind") == "htb" for x in q)
        if d.profile.rate_mbit:
            run_all(self.net, node, tc.rate_argvs(dev, d.profile,
                                                   verb="change" if had_rate else "replace"))
        elif had_rate:
            run_all(self.net, node, [tc.delete_root_argv(dev)])
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
                raise ShapingError(f"{self._death(d)} before loading its new config")
            if time.monotonic() > deadline:
                raise ShapingError(f"delay line {d.label} did not load its new config within "
                                   f"{DELAYLINE_START_TIMEOUT_S:g} s")
            time.sleep(0.01)

    def _stats(self, d: Direction) -> dict:
        try:
            return json.loads(self.net.read_text(d.end.router, d.stats) or "{}")
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

    def releases(self) -> tuple[int, int]:
        """(late, all) releases the delay lines counted so far: each running one is asked
        (SIGUSR1) to write its statistics at its next wake-up and waited for, at most
        STATS_WAIT_S (one holding a packet for longer wakes only when it is due; its last
        statistics, about a second old, count then)."""
        got = {d.label: self._stats(d) for d in self.directions if d.stats}
        waiting = [d for d in self.directions if d.stats and d.proc and d.proc.poll() is None]
        asked = {d.label: got[d.label].get("stats_requests", 0) for d in waiting}
        for d in waiting:
            d.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + STATS_WAIT_S
        while waiting and time.monotonic() < deadline:
            time.sleep(0.01)
            for d in waiting:
                got[d.label] = self._stats(d)
            waiting = [d for d in waiting
                       if got[d.label].get("stats_requests", 0) <= asked[d.label]]
        return (sum(int(s.get("late_releases", 0)) for s in got.values()),
                sum(int(s.get("releases", 0)) for s in got.values()))

    def stats(self) -> dict[str, dict]:
        """Per-direction statistics the delay-line processes wrote."""
        return {d.label: self._stats(d) for d in self.directions if d.stats}

    def stop(self) -> None:
        stop_processes([d.proc for d in self.directions if d.proc is not None])


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
