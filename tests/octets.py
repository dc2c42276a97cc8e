"""Test-suite helper: the second octet of a stand-in network's ``10.<x>.0.0/16``, one harness
per octet on this machine, even when harnesses start at the same moment in pytest-xdist workers.

A harness reserves its octet by holding a lock on a file named after it (released by
``release`` or when its process ends), and passes over octets an address of this machine
already uses (the bridge of a run that was killed before its clean-up).
"""
from __future__ import annotations

import fcntl
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

LOCK_DIR = Path("/run/testbed-test-octets")


@dataclass
class Octet:
    """A reserved octet; ``release`` once the harness's addresses are gone."""

    value: int
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the lock
            self.fd = None


def reserve_octet(first: int, count: int, seed: int) -> Octet:
    """An octet in ``first .. first + count - 1``, tried from ``seed`` on, that no other harness
    holds and no address of this machine uses."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    used = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True,
                          timeout=30).stdout
    for k in range(count):
        octet = first + (seed + k) % count
        if f" 10.{octet}." in used:
            continue
        fd = os.open(LOCK_DIR / str(octet), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)  # another harness holds it
            continue
        return Octet(octet, fd)
    raise RuntimeError(f"no free 10.{first}-{first + count - 1}.0.0/16 for a stand-in network")
