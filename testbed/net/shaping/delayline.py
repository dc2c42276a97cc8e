"""A userspace delay line: holds forwarded packets in an NFQUEUE and releases them late.

One process serves one queue (one link direction) inside a router namespace. It speaks raw
nfnetlink (``testbed.net.shaping.nfnetlink``; no libnetfilter_queue) because the two things
that make it fast are not offered by the Python bindings (see docs/facts.md):

- ``NFQA_CFG_F_GSO``: 64 KB GSO packets are queued whole instead of being segmented;
- one ``NFQNL_MSG_VERDICT_BATCH`` per release tick accepts every packet up to an id at once.

Only metadata is copied (``NFQNL_COPY_META``): the payload never crosses into userspace.

Timing: a packet read at time t is released at ``max(t + delay + jitter_sample, last_release)``,
so jitter never reorders (netem's default reorders; this one does not, and says so). Bernoulli
loss is done in the kernel (``-m statistic``) by the shaper; Gilbert–Elliott loss is done here,
with a DROP verdict at arrival.

Run as ``python -m testbed.net.shaping.delayline --config FILE`` inside the namespace. The config
(JSON) is re-read on SIGHUP (that is how time-varying steps change the delay); statistics, with
the config in force (``config``, read back by the shaper), are written to ``stats`` next to the
config about once a second, at once after a reload, at its next wake-up after a SIGUSR1 (counted
in ``stats_requests``, so that the shaper reads them fresh), and at exit. SIGTERM/SIGINT stop it;
packets still held are accepted on the way out (none are lost to a stop).

This module imports only the standard library (and ``nfnetlink``, which does too) so that a
delay-line process starts in ~50 ms.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
import select
import signal
import socket
import sys
import time

from testbed.net.shaping.nfnetlink import (NF_ACCEPT, NF_DROP, enable_rx_timestamps,
                                           open_queue, packet_ids, verdict_message)

# A kernel timestamp older than this (or in the future) is not a receive time: TCP's pacing
# leaves a monotonic departure time in some packets. Those use the wake-up estimate instead.
MAX_STAMP_AGE_S = 0.05
PR_SET_TIMERSLACK = 29

RECV_BUF = 4 << 20          # one recv can carry thousands of metadata-only messages
RELEASE_SLACK_S = 10e-6     # release what is due within 10 µs (+ half a wake-up) together
WAKE_LATENCY_S = 100e-6     # first guess of how late a timed wake-up comes (VMs: ~90-150 µs)
WAKE_LATENCY_MAX_S = 1e-3   # never aim earlier than this
SPIN_S = 50e-6              # aim this much before (due − wake latency), then spin to due
SPIN_MAX_S = 200e-6         # never spin longer than this per wake-up (CPU budget)
SPIN_MAX_HELD = 8           # spin only for sparse traffic; bulk transfers need the CPU more
MAX_RECV_PER_TICK = 64      # bound reading so releases are never starved
STATS_EVERY_S = 1.0
# A release this much after its packets were due counts late (``late_releases``; the row's
# fidelity reads the share). Idle, at most 0.1 ms here; beside two CPU hogs or UML, 1-9 ms.
LATE_RELEASE_S = 1e-3
IDLE_WAIT_S = 0.05         # wake-up when idle, so a SIGHUP reload applies promptly
PARETO_ALPHA = 3.0          # shape of the Pareto jitter tail (finite variance)


class Sampler:
    """Draws per-packet one-way delays in seconds for a delay/jitter/distribution config."""

    def __init__(self, cfg: dict, rng: random.Random):
        self.base = float(cfg.get("delay_ms", 0.0)) / 1000
        self.jitter = float(cfg.get("jitter_ms", 0.0)) / 1000
        self.dist = cfg.get("jitter_distribution", "normal")
        self.rng = rng

    def draw(self) -> float:
        """One delay in seconds, never negative."""
        if self.jitter <= 0:
            return self.base
        return max(0.0, self.base + self.jitter * self._unit())

    def _unit(self) -> float:
        """A zero-mean sample with unit spread (std 1; uniform: ±1)."""
        r = self.rng
        if self.dist == "uniform":
            return r.uniform(-1.0, 1.0)
        if self.dist == "pareto":
            return _pareto_unit(r)
        if self.dist == "paretonormal":  # netem's mix: a quarter normal, three quarters Pareto
            return 0.25 * r.gauss(0.0, 1.0) + 0.75 * _pareto_unit(r)
        return r.gauss(0.0, 1.0)


def _pareto_unit(r: random.Random) -> float:
    """Pareto(alpha) shifted to zero mean and scaled to unit standard deviation."""
    a = PARETO_ALPHA
    mean = a / (a - 1)
    std = math.sqrt(a / ((a - 1) ** 2 * (a - 2)))
    return (r.paretovariate(a) - mean) / std


class GilbertElliott:
    """Two-state loss: per packet, move between good and bad, then drop with the state's rate."""

    def __init__(self, cfg: dict | None, rng: random.Random):
        self.cfg, self.rng, self.bad = cfg, rng, False

    def drop(self) -> bool:
        c = self.cfg
        if not c:
            return False
        r = self.rng.random() * 100
        self.bad = (r >= c["r_pct"]) if self.bad else (r < c["p_pct"])
        rate = c.get("loss_bad_pct", 100.0) if self.bad else c.get("loss_good_pct", 0.0)
        return self.rng.random() * 100 < rate


class DelayLine:
    """The event loop of one queue: read arrivals, schedule releases, batch verdicts."""

    def __init__(self, queue: int, config_path: str, stats_path: str, seed: int = 0):
        self.queue, self.config_path, self.stats_path = queue, config_path, stats_path
        self.rng = random.Random(seed)
        self.held: collections.deque[tuple[float, int]] = collections.deque()
        self.last_release = 0.0
        # releases: verdicts sent; late: after their first packet was due (LATE_RELEASE_S)
        self.stats = {"queue": queue, "packets": 0, "released": 0, "ge_dropped": 0,
                      "verdict_errors": 0, "stamped": 0, "max_held": 0, "releases": 0,
                      "late_releases": 0, "late_max_us": 0.0,
                      "config_loads": 0, "stats_requests": 0, "delay_ms": None,
                      "started": time.time()}
        self.reload_wanted, self.stats_wanted = True, False
        self.running = True
        self.sock: socket.socket | None = None
        # Timed wake-ups come late by a roughly constant amount on a given machine; aim that
        # much early (learnt as a moving average) so that releases are on time, not late.
        self.wake_latency = WAKE_LATENCY_S

    def reload(self) -> None:
        with open(self.config_path, encoding="utf-8") as f:
            cfg = json.load(f)
        self.sampler = Sampler(cfg, self.rng)
        self.ge = GilbertElliott(cfg.get("gilbert_elliott"), self.rng)
        self.stats["config_loads"] += 1
        self.stats["delay_ms"] = cfg.get("delay_ms", 0.0)
        self.stats["config"] = cfg  # what is in force, for the shaper's read-back
        self.reload_wanted = False

    def run(self) -> None:
        self.sock = open_queue(self.queue)
        stamper = enable_rx_timestamps()  # noqa: F841 (kept open for the life of the loop)
        buf = bytearray(RECV_BUF)
        view = memoryview(buf)
        next_stats = 0.0
        while self.running:
            if self.reload_wanted:
                self.reload()
                next_stats = 0.0  # show the new config_loads at once: the shaper waits for it
            now = time.monotonic()
            due = self.held[0][0] if self.held else now + IDLE_WAIT_S
            spin = 0 < len(self.held) <= SPIN_MAX_HELD
            target = due - self.wake_latency - (SPIN_S if spin else 0.0) if self.held else due
            timed = bool(self.held) and target > now
            ready, _, _ = select.select([self.sock], [], [], max(0.0, target - now))
            if timed and not ready:
                self._learn_wake_latency(time.monotonic() - target)
                if spin:
                    _spin_until(due)
            if ready:
                self._read(view, now)
            self._release(time.monotonic())
            if self.stats_wanted or time.monotonic() >= next_stats:
                self.stats["stats_requests"] += self.stats_wanted
                self.stats_wanted = False
                self.write_stats()
                next_stats = time.monotonic() + STATS_EVERY_S
        self._flush()

    def _read(self, view: memoryview, waited_since: float) -> None:
        """Read every waiting packet and schedule its release from its arrival time: the
        kernel's receive stamp when it has one, else an estimate (a wake-up on a readable
        socket comes about one wake latency after the packet, never before we began waiting)."""
        ids: list[int] = []
        stamps: list[float] = []
        for _ in range(MAX_RECV_PER_TICK):
            try:
                n = self.sock.recv_into(view)
            except (BlockingIOError, InterruptedError):
                break
            self.stats["verdict_errors"] += packet_ids(view, n, ids, stamps)
        if not ids:
            return
        mono, wall = time.monotonic(), time.time()
        guess = max(waited_since, mono - self.wake_latency)
        held, draw, last = self.held, self.sampler.draw, self.last_release
        stamped = 0
        for pid, ts in zip(ids, stamps):
            if self.ge.cfg and self.ge.drop():
                self.sock.send(verdict_message(self.queue, NF_DROP, pid, batch=False))
                self.stats["ge_dropped"] += 1
                continue
            age = wall - ts
            if 0.0 <= age <= MAX_STAMP_AGE_S:
                arrival = mono - age
                stamped += 1
            else:
                arrival = guess
            last = max(arrival + draw(), last)
            held.append((last, pid))
        self.last_release = last
        self.stats["packets"] += len(ids)
        self.stats["stamped"] += stamped
        self.stats["max_held"] = max(self.stats["max_held"], len(held))

    def _learn_wake_latency(self, late_s: float) -> None:
        est = self.wake_latency + 0.1 * (late_s - self.wake_latency)
        self.wake_latency = min(max(est, 0.0), WAKE_LATENCY_MAX_S)

    def _release(self, now: float) -> None:
        held = self.held
        horizon = now + RELEASE_SLACK_S
        if not held or held[0][0] > horizon:
            return
        late = now - held[0][0]
        count, last_id = 0, None
        while held and held[0][0] <= horizon:
            last_id = held.popleft()[1]
            count += 1
        self.sock.send(verdict_message(self.queue, NF_ACCEPT, last_id, batch=True))
        self.stats["released"] += count
        self.stats["releases"] += 1
        self.stats["late_releases"] += late > LATE_RELEASE_S
        if late * 1e6 > self.stats["late_max_us"]:
            self.stats["late_max_us"] = round(late * 1e6, 1)

    def _flush(self) -> None:
        """Accept everything still held: a stopped delay line must not eat packets."""
        if self.held and self.sock is not None:
            self.sock.send(verdict_message(self.queue, NF_ACCEPT, self.held[-1][1], batch=True))
            self.stats["released"] += len(self.held)
            self.held.clear()
        self.write_stats()

    def write_stats(self) -> None:
        tmp = self.stats_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.stats, f)
        os.replace(tmp, self.stats_path)


def _spin_until(due: float) -> None:
    """Busy-wait the last few tens of µs before a release (the wake-up aimed SPIN_S early):
    a timed sleep cannot land closer than its wake latency's variation."""
    limit = time.monotonic() + SPIN_MAX_S
    while True:
        now = time.monotonic()
        if now >= due or now >= limit:
            return


def _tight_timer_slack() -> None:
    """Ask for 1 ns timer slack (default 50 µs) so timed releases are not rounded late."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # an old libc: releases are then up to 50 µs later; measured fidelity shows it


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queue", type=int, required=True)
    ap.add_argument("--config", required=True, help="JSON: delay_ms, jitter_ms, ...")
    ap.add_argument("--stats", required=True, help="where to write statistics (JSON)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    line = DelayLine(args.queue, args.config, args.stats, args.seed)
    _tight_timer_slack()

    def stop(*_):
        line.running = False

    def hup(*_):
        line.reload_wanted = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, hup)
    signal.signal(signal.SIGUSR1, lambda *_: setattr(line, "stats_wanted", True))
    try:
        line.reload()
        line.run()
    except OSError as e:
        print(f"delay line queue {args.queue}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
