"""Shared test helpers: root-only tests skip with a reason when not root."""
from __future__ import annotations

import os
import subprocess

import pytest

from testbed.sim import calibration


def pytest_collection_modifyitems(config, items):
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="needs root (namespaces, tc, iptables)")
        for item in items:
            if "root" in item.keywords:
                item.add_marker(skip)


def _netns_list() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


@pytest.fixture
def netns_list():
    """A function returning the names of the network namespaces that exist now."""
    return _netns_list


@pytest.fixture
def no_overheads(monkeypatch):
    """The simulator's textbook model: no software costs, so closed forms (and another
    simulator's exact-input makespans) hold exactly."""
    for name in ("SLEEP_OVERSHOOT_S", "ACTION_GAP_S", "SEND_CALL_S", "MESSAGE_LATENCY_S",
                 "POST_RECV_S"):
        monkeypatch.setattr(calibration, name, 0.0)
    monkeypatch.setattr(calibration, "UNSHAPED_BYTES_PER_S", float("inf"))
