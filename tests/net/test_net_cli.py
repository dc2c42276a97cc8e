"""`net check`, `net down` and `clean` from the command line, as a user runs them."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.net import ledger as ledgers

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=240, env={"COLUMNS": "200", "PATH":
                                                                  "/usr/sbin:/usr/bin:/sbin:/bin"})


@pytest.mark.alone  # the measured RTT against the configured: measured time
@pytest.mark.apart_from_quiet
def test_net_check_prints_configured_and_measured_rtt_and_tears_down():
    res = cli("net", "check", "topologies/two-dc.yaml", "--no-rate")
    assert res.returncode == 0, res.stderr
    tag = re.search(r"up: tag (tb[0-9a-f]{6})", res.stdout).group(1)
    row = next(ln for ln in res.stdout.splitlines() if "dc1-dc2" in ln)
    cells = [c.strip() for c in row.split("│") if c.strip()]
    configured, median = float(cells[1]), float(cells[2])
    assert configured == 20.0 and abs(median - 20.0) < 1.5
    assert not any(ledgers.tag_of(n) == tag for n in ledgers.tagged_namespaces())


def test_net_check_keep_then_net_down():
    res = cli("net", "check", "topologies/two-dc.yaml", "--no-rate", "--keep")
    assert res.returncode == 0, res.stderr
    tag = re.search(r"net down (tb[0-9a-f]{6})", res.stdout).group(1)
    assert any(n.startswith(tag) for n in ledgers.tagged_namespaces())
    down = cli("net", "down", tag)
    assert down.returncode == 0 and f"removed {tag}" in down.stdout
    assert not any(n.startswith(tag) for n in ledgers.tagged_namespaces())


def test_net_check_rejects_a_bad_topology_before_building(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ndcs: [{name: a, hosts: 1}, {name: b, hosts: 1}]\n"
                   "inter_dc: {delay_ms: -3}\n")
    res = cli("net", "check", str(bad))
    assert res.returncode == 2
    assert "inter_dc.delay_ms" in res.stderr and "Traceback" not in res.stderr
