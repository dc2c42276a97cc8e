"""What each inter-DC link direction sent, sampled while a cell's workers run, so that the
per-iteration series (iterations.csv) can say how many bytes crossed each link in each
iteration: a sync step's all-reduce shows up where it happened.

The counters are the ones ``Shaper.tx_counters`` reads once before and once after the workers
(the sending router interface's ``tx_bytes``: whole frames, headers included), here read from
``/proc/net/dev`` of the router's network namespace. A thread enters each namespace once
(``setns``), opens that file and goes back; the kernel regenerates the open file's text for
that namespace on every read (about 10 µs), so the sampler rereads it every ``SAMPLE_S`` on
the monotonic clock, the clock of the workers' traces on this machine. Only routers whose
namespace is on this machine are sampled (``Shaper.counter_namespaces``, from
``Backend.netns_file``); for the others no samples are taken and the series has no byte
columns.
"""
from __future__ import annotations

import bisect
import ctypes
import logging
import os
import threading
import time
from array import array
from collections import defaultdict

log = logging.getLogger(__name__)

# Sampling period: at 100 Mbit/s a sample is 125 KB of traffic apart; between two samples the
# bytes at an iteration's boundary are interpolated linearly (a shaped link sends at its rate).
SAMPLE_S = 0.01
_CLONE_NEWNET = 0x40000000


def _open_in(netns: str) -> int:
    """An open ``/proc/thread-self/net/dev`` of namespace ``netns`` (from a thread that
    enters it and leaves again; the calling thread never changes namespace)."""
    out: dict[str, int | BaseException] = {}

    def enter() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            target = os.open(netns, os.O_RDONLY)
            try:
                if libc.setns(target, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {netns}")
                try:
                    out["fd"] = os.open("/proc/thread-self/net/dev", os.O_RDONLY)
                finally:
                    if libc.setns(own, _CLONE_NEWNET) != 0:  # the thread ends anyway
                        raise OSError(ctypes.get_errno(), "setns back")
            finally:
                os.close(target)
        except OSError as e:
            out["error"] = e
        finally:
            os.close(own)

    t = threading.Thread(target=enter, name="wire-sampler-setns")
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["fd"]  # type: ignore[return-value]


def tx_bytes(text: str, ifaces: set[str]) -> dict[str, int]:
    """The ``tx_bytes`` of each of ``ifaces`` in a ``/proc/net/dev`` text."""
    out = {}
    for line in text.splitlines()[2:]:
        name, _, fields = line.partition(":")
        name = name.strip()
        if name in ifaces:
            out[name] = int(fields.split()[8])
    return out


class WireSampler:
    """Samples the sending interfaces of ``sources`` (direction key, e.g. ``"dc1->dc2"`` →
    (the file of its router's network namespace, interface)) every ``SAMPLE_S`` while in its
    ``with`` block."""

    def __init__(self, sources: dict[str, tuple[str, str]], period_s: float = SAMPLE_S):
        self.sources, self.period_s = sources, period_s
        # monotonic ns of each sample, and each direction's tx_bytes then (8 bytes a value:
        # an hour's cell keeps 360,000 samples)
        self.times = array("q")
        self.sent: dict[str, array] = defaultdict(lambda: array("q"))
        self._fds: dict[str, int] = {}
        self._ifaces: dict[str, set[str]] = defaultdict(set)  # namespace → its sampled ones
        for ns, iface in sources.values():
            self._ifaces[ns].add(iface)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> WireSampler:
        for ns in sorted({ns for ns, _ in self.sources.values()}):
            try:
                self._fds[ns] = _open_in(ns)
            except OSError as e:  # gone, or not a namespace: no samples
                log.info("no per-iteration link bytes from %s: %s", ns, e)
                self._close()
                return self
        if self._fds:
            self._sample()
            self._thread = threading.Thread(target=self._loop, name="wire-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._sample()
        self._close()

    def _close(self) -> None:
        for fd in self._fds.values():  # an open file holds its namespace: closed with the cell
            os.close(fd)
        self._fds.clear()

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def _sample(self) -> None:
        if not self._fds:
            return
        now = time.monotonic_ns()
        read = {ns: tx_bytes(os.pread(fd, 1 << 16, 0).decode(), self._ifaces[ns])
                for ns, fd in self._fds.items()}
        counts = {}
        for key, (ns, iface) in self.sources.items():
            value = read[ns].get(iface)
            if value is None:
                return  # an interface gone mid-cell: drop the sample
            counts[key] = value
        self.times.append(now)
        for key, value in counts.items():
            self.sent[key].append(value)

    def sampled(self) -> bool:
        return len(self.times) >= 2

    def at(self, key: str, t_ns: int) -> float:
        """Direction ``key``'s counter at ``t_ns``, interpolated between the samples around
        it (clamped to the first and last sample)."""
        ts, ys = self.times, self.sent[key]
        i = bisect.bisect_left(ts, t_ns)
        if i == 0:
            return float(ys[0])
        if i == len(ts):
            return float(ys[-1])
        t0, t1 = ts[i - 1], ts[i]
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (t_ns - t0) / (t1 - t0)

    def between(self, t0_ns: int, t1_ns: int) -> dict[str, int]:
        """Bytes each direction sent from ``t0_ns`` to ``t1_ns`` (empty without samples)."""
        if not self.sampled():
            return {}
        return {k: round(self.at(k, t1_ns) - self.at(k, t0_ns)) for k in self.sources}
