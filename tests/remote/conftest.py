"""Fixtures: stand-in lab hosts (sshd in network namespaces), removed after the tests."""
from __future__ import annotations

import subprocess

import pytest

from standin import StandInLab


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Two DCs with two stand-in hosts each, shared by a module's tests."""
    standin = StandInLab(tmp_path_factory.mktemp("lab"), {"dc1": 2, "dc2": 2}).start()
    try:
        yield standin
    finally:
        standin.stop()
        leftovers = standin.alive()
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True,
                               text=True).stdout
        assert not leftovers and standin.tag not in links, (leftovers, standin.tag)


@pytest.fixture
def known_hosts(lab, tmp_path):
    """A known_hosts file (per test) holding every stand-in host's key."""
    return lab.known_hosts(tmp_path / "known_hosts")


@pytest.fixture
def inventory(lab, tmp_path):
    return lab.inventory(tmp_path / "inventory.ini")
