"""Fixtures: stand-in machines (sshd in network namespaces of this box, on a 9000-byte
underlay), removed after the tests. Each machine builds its share of a ``backend: cluster``
network inside its own namespace, as a real machine does in its root namespace."""
from __future__ import annotations

import fcntl
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remote"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from standin import StandInLab  # noqa: E402
from standin_slurm import NodeSpec, StandInSlurm, missing_packages  # noqa: E402
from clusterrun import experiment, run  # noqa: E402

UNDERLAY_MTU = 9000


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    """Two stand-in machines shared by a module's tests."""
    standin = StandInLab(tmp_path_factory.mktemp("machines"), {"machines": 2},
                         mtu=UNDERLAY_MTU).start()
    try:
        yield standin
    finally:
        standin.stop()
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True,
                               text=True).stdout
        assert not standin.alive() and standin.tag not in links, standin.tag


@pytest.fixture
def machine_files(machines, tmp_path):
    """(inventory, known_hosts) for the stand-in machines, 8 cores and 8 GB each."""
    inv = machines.inventory(tmp_path / "machines.ini",
                             extra_vars="testbed_cores=8\ntestbed_memory_gb=8")
    return inv, machines.known_hosts(tmp_path / "known_hosts")


@pytest.fixture(scope="module")
def slurm_nodes():
    """A stand-in Slurm cluster of two nodes with room for a DC each (tests/slurm's harness:
    a real slurmctld and slurmd per node namespace), stopped after the module's tests."""
    missing = missing_packages()
    if missing:
        pytest.fail(f"Debian packages {', '.join(missing)} are not installed: run "
                    "`bash setup.sh`", pytrace=False)
    cluster = StandInSlurm([NodeSpec(cpus=4, memory_mb=8000)] * 2).start()
    try:
        yield cluster
    finally:
        cluster.stop()
        assert not cluster.leftovers(), cluster.leftovers()


@pytest.fixture(scope="session")
def netns_row(tmp_path_factory, worker_id) -> pd.Series:
    """The cluster tests' experiment run on one box (``backend: netns``), once per suite run:
    the SSH and the Slurm cluster run are both held against it. Under pytest-xdist they may run
    on different workers, so the first to ask runs it and leaves its row where every worker
    looks (the workers' common temporary directory), under a lock."""
    base = tmp_path_factory.getbasetemp()
    shared = base if worker_id == "master" else base.parent
    path = shared / "cluster-netns-row.json"
    with open(shared / "cluster-netns-row.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            _, row = run(experiment("netns"), tmp_path_factory.mktemp("netns"))
            assert row["status"] == "ok", row["error"]
            path.write_text(row.to_json(), encoding="utf-8")
    return pd.Series(json.loads(path.read_text(encoding="utf-8")))
