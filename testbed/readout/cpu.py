"""The CPU over a cell's workers' phase, from /proc/stat: what self-fidelity
(``testbed.readout.fidelity``) compares with its ``CPU_BUSY_MAX_PCT``. Only meaningful where
the workers run on this machine (``Backend.hosts_here``). It counts the CPUs the run may use
(``run_cpus``: the whole box, or what ``taskset`` or a cpuset left it), since the workers
inherit the controller's affinity: a busy CPU they cannot run on does not slow them."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from testbed.errors import MachineError

PROC_STAT = Path("/proc/stat")
# /proc/stat counts in ticks of 10 ms (USER_HZ 100): a sample every 0.25 s keeps the busy share
# of a window of a second or more within a few % while costing nothing measurable
SAMPLE_INTERVAL_S = 0.25


def run_cpus() -> frozenset[int]:
    """The CPUs this process, and so the workers it starts, may run on (its affinity: all of
    them, or what ``taskset``, a cpuset or a Slurm allocation left it)."""
    return frozenset(os.sched_getaffinity(0))


def read_cpu_jiffies(path: Path = PROC_STAT,
                     cpus: frozenset[int] | None = None) -> tuple[int, int]:
    """(busy, total) clock ticks since boot from /proc/stat: of the whole box (its ``cpu``
    line) when ``cpus`` is None or holds every CPU the file lists, else the sum of those
    CPUs' ``cpuN`` lines. Busy counts user, nice, system, irq, softirq and steal (a
    hypervisor's steal is a CPU we did not get); idle and iowait are idle. Raises
    MachineError when the file cannot be read or parsed, or lists none of ``cpus``."""
    try:
        lines = path.read_text(encoding="ascii").splitlines()
        first = lines[0].split()
        if first[0] != "cpu":
            raise MachineError(f"{path} does not start with the 'cpu' line")
        per_cpu = {int(f[0][3:]): f for f in map(str.split, lines[1:])
                   if f and f[0].startswith("cpu") and f[0][3:].isdigit()}
        chosen = [first] if cpus is None or cpus >= per_cpu.keys() else \
            [per_cpu[c] for c in sorted(cpus) if c in per_cpu]
        if not chosen:
            raise MachineError(f"{path} lists none of the CPUs {sorted(cpus or ())}")
        busy = total = 0
        for fields in chosen:
            user, nice, system, idle, iowait, irq, softirq, steal = map(int, fields[1:9])
            cpu_busy = user + nice + system + irq + softirq + steal
            busy, total = busy + cpu_busy, total + cpu_busy + idle + iowait
    except (OSError, IndexError, ValueError) as e:
        raise MachineError(f"cannot read the CPU counters in {path}: {e}") from None
    return busy, total


class CpuSampler:
    """The box's busy share over the workers' phase, from /proc/stat: sampled at ``start``,
    every ``interval_s`` in a thread, and at ``stop`` (or over a ``with`` block), so that
    ``busy_pct_between`` can give the share over the measured iterations alone (worker
    start-up, torch's import and the rendezvous are busy in a different way). Samples are
    (CLOCK_MONOTONIC ns, busy ticks, total ticks), the clock the traces use on one machine."""

    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S, path: Path = PROC_STAT):
        self.interval_s, self.path = interval_s, path
        self.cpus: frozenset[int] | None = None  # the CPUs counted, fixed at start()
        self.samples: list[tuple[int, int, int]] = []
        self.busy_pct: float | None = None  # over the whole phase, after stop()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: MachineError | None = None

    def _sample(self) -> None:
        self.samples.append((time.monotonic_ns(), *read_cpu_jiffies(self.path, self.cpus)))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._sample()
            except MachineError as e:
                self._error = e
                return

    def start(self) -> None:
        """Take the first sample and start sampling; raises MachineError when /proc/stat
        cannot be read."""
        self.samples, self.busy_pct, self._error = [], None, None
        self.cpus = run_cpus()
        self._sample()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> float | None:
        """Stop sampling, take the last sample; returns (and keeps) the busy share (%) since
        ``start``, None when no tick elapsed. Raises MachineError when /proc/stat could not
        be read or ``start`` was not called."""
        if self._thread is None:
            raise MachineError("CpuSampler.stop() without start()")
        self._stop.set()
        self._thread.join()
        self._thread = None
        if self._error is not None:
            raise self._error
        self._sample()
        self.busy_pct = busy_pct(self.samples[0], self.samples[-1])
        return self.busy_pct

    def busy_pct_between(self, t0_ns: int, t1_ns: int) -> float | None:
        """The busy share (%) from the last sample at or before ``t0_ns`` to the first at or
        after ``t1_ns`` (CLOCK_MONOTONIC ns; the window is widened to samples, at most
        ``interval_s`` each side); the whole phase's when the window is not inside it."""
        before = [x for x in self.samples if x[0] <= t0_ns]
        after = [x for x in self.samples if x[0] >= t1_ns]
        if not before or not after:
            return self.busy_pct
        return busy_pct(before[-1], after[0])

    def __enter__(self) -> "CpuSampler":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def busy_pct(a: tuple[int, int, int], b: tuple[int, int, int]) -> float | None:
    """The busy share (%) between two samples (ns, busy ticks, total ticks); None when no
    tick elapsed."""
    d_total = b[2] - a[2]
    return 100.0 * (b[1] - a[1]) / d_total if d_total > 0 else None
