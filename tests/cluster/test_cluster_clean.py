"""``clean`` of a network spread over machines that cannot be reached: the record is kept (a
later clean retries) and says why, until ``clean --forget`` drops it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testbed.net import ledger as ledgers

pytestmark = [pytest.mark.root]
ROOT = Path(__file__).resolve().parents[2]


def clean(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed", "clean", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_unreachable_machines_keep_the_record_until_forgotten(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()  # a dead owner: the controller was killed
    led = ledgers.Ledger(ledgers.new_tag(), owner_pid=gone.pid, backend="cluster")
    led.machines = {"inventory": str(tmp_path / "gone.ini"),
                    "known_hosts": str(tmp_path / "known_hosts"),
                    "run_dir": "/tmp/" + led.tag, "tags": {"box-1": ledgers.new_tag()}}
    led.save()
    try:
        res = clean("--tag", led.tag)
        assert res.returncode == 1 and "cannot reach its machines" in res.stderr, res.stderr
        assert led.path.exists()  # kept: a later clean tries again
        res = clean("--forget", led.tag)
        assert res.returncode == 0 and f"forgot {led.tag}" in res.stdout, res.stdout + res.stderr
        assert not led.path.exists()
        assert clean("--tag", led.tag).returncode == 0
    finally:
        led.remove_file()
