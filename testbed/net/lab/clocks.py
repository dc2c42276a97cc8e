"""Clock offsets of lab hosts, and whether their clocks are NTP-synchronised.

The offset is estimated over one SSH channel to a small echo loop on the host (no process start
per sample): the controller sends a line at local time t0, the host answers with its
``monotonic_ns`` and ``time_ns``, the answer arrives at t1. Each sample gives
offset = remote − (t0 + t1) / 2 with an error of at most (t1 − t0) / 2; the sample with the
smallest round trip is kept (as NTP's clock filter does). Workers trace on CLOCK_MONOTONIC, so
the monotonic offset is the one used to align timelines; the wall-clock offset is recorded too
(it is what NTP keeps small).
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

from fabric import Connection

from testbed.errors import CommandError, TestbedError
from testbed.net.lab import ssh
from testbed.net.lab.inventory import LabHost

log = logging.getLogger(__name__)

DEFAULT_SAMPLES = 9
SAMPLE_TIMEOUT_S = 5.0
# Reads a line, answers "monotonic_ns time_ns"; exits when the controller closes stdin.
ECHO_LOOP = ("import sys, time\n"
             "for _ in sys.stdin:\n"
             "    print(time.monotonic_ns(), time.time_ns(), flush=True)\n")


@dataclass
class ClockOffset:
    """One host's clock relative to the controller's, in ns (positive: the host is ahead)."""

    host: str
    monotonic_offset_ns: int
    realtime_offset_ns: int
    rtt_ns: int              # of the kept sample; |error| ≤ rtt / 2
    samples: int
    ntp: str                 # "synchronised" | "not synchronised" | "unknown: …"

    @property
    def uncertainty_ns(self) -> int:
        return self.rtt_ns // 2

    def as_dict(self) -> dict:
        return {**asdict(self), "uncertainty_ns": self.uncertainty_ns}


def _read_line(chan, timeout_s: float) -> bytes:
    buf, deadline = b"", time.monotonic() + timeout_s
    while not buf.endswith(b"\n"):
        if time.monotonic() > deadline or chan.exit_status_ready() and not chan.recv_ready():
            raise TestbedError(f"clock echo loop stopped answering: {buf!r}")
        if chan.recv_ready():
            buf += chan.recv(256)
        else:
            time.sleep(0.0002)
    return buf


def estimate_offset(conn: Connection, host: LabHost, samples: int = DEFAULT_SAMPLES
                    ) -> tuple[int, int, int]:
    """(monotonic offset, wall-clock offset, rtt) in ns from the minimum-RTT sample of
    ``samples`` round trips. Raises TestbedError when the host does not answer."""
    chan = conn.client.get_transport().open_session()
    try:
        chan.exec_command(ssh.command_line([host.python, "-u", "-c", ECHO_LOOP]))
        chan.sendall(b"\n")  # the first answer waits for the interpreter to start: dropped
        _read_line(chan, SAMPLE_TIMEOUT_S + 30)
        best = None
        for _ in range(samples):
            t0, w0 = time.monotonic_ns(), time.time_ns()
            chan.sendall(b"\n")
            line = _read_line(chan, SAMPLE_TIMEOUT_S)
            t1, w1 = time.monotonic_ns(), time.time_ns()
            mono, wall = (int(x) for x in line.split())
            sample = (t1 - t0, mono - (t0 + t1) // 2, wall - (w0 + w1) // 2)
            if best is None or sample[0] < best[0]:
                best = sample
        rtt, mono_off, wall_off = best
        return mono_off, wall_off, rtt
    finally:
        chan.close()


# How a host says whether its clock is synchronised: systemd's timedatectl, else chrony's.
NTP_QUERIES = (["timedatectl", "show", "-p", "NTPSynchronized", "--value"],
               ["chronyc", "-n", "tracking"])
NTP_QUERY_TIMEOUT_S = 10.0


def ntp_state(conn: Connection, host: LabHost) -> str:
    """Whether the host's clock is synchronised: ``timedatectl`` (systemd), else ``chronyc``.
    The answer only informs (a warning, the ledger's clock record), so a query that fails or
    does not answer within NTP_QUERY_TIMEOUT_S makes it ``unknown: …`` and never fails the
    lab: under load a host without systemd was seen to leave timedatectl hanging."""
    why = []
    for argv in NTP_QUERIES:
        try:
            r = ssh.run(conn, host, argv, check=False, timeout=NTP_QUERY_TIMEOUT_S)
        except CommandError as e:  # timed out, or no channel
            why.append(f"{argv[0]}: {e.output}")
            continue
        state = _ntp_answer(argv[0], r.returncode, r.stdout)
        if state is not None:
            return state
        lines = (r.stderr or r.stdout).strip().splitlines()
        if r.returncode == -1:  # no exit status came back: the timeout passed
            lines = [f"{argv[0]}: timed out after {NTP_QUERY_TIMEOUT_S:g} s"]
        why.append(lines[-1] if lines else f"{argv[0]} exited {r.returncode}")
    return "unknown: " + (why[0] if why else "neither timedatectl nor chronyc answered")


def _ntp_answer(tool: str, code: int, out: str) -> str | None:
    """What one tool's answer says, or None when it did not say."""
    if code != 0:
        return None
    if tool == "timedatectl":
        if out.strip() not in ("yes", "no"):
            return None
        return "synchronised" if out.strip() == "yes" else "not synchronised"
    leap = next((ln.split(":", 1)[1].strip() for ln in out.splitlines()
                 if ln.startswith("Leap status")), "")
    return "synchronised" if leap == "Normal" else "not synchronised"


def measure(conn: Connection, host: LabHost, samples: int = DEFAULT_SAMPLES) -> ClockOffset:
    """The host's clock offsets and NTP state; logs a warning when it is not synchronised."""
    mono, wall, rtt = estimate_offset(conn, host, samples)
    state = ntp_state(conn, host)
    if state != "synchronised":
        log.warning("clock of %s is %s (run the timesync role: chrony); wall-clock offset "
                    "%.3f ms ± %.3f ms", host.name, state, wall / 1e6, rtt / 2e6)
    return ClockOffset(host.name, mono, wall, rtt, samples, state)
