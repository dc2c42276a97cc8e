"""Shared test helpers: root-only tests skip with a reason when not root."""
from __future__ import annotations

import os
import subprocess

import pytest


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
