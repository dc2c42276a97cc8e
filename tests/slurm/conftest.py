"""Fixtures: a stand-in Slurm cluster (a real slurmctld, one real slurmd per stand-in node in
its own network namespace, a munged of its own), removed after the module's tests.

Tests that use it are marked ``root`` (namespaces, bridges: skipped when not root, as
everywhere in the suite); as root, missing Slurm packages are a failure that says how to
install them, never a skip."""
from __future__ import annotations

import pytest

from standin_slurm import NodeSpec, StandInSlurm, missing_packages

# Three nodes that differ in every field allocation_nodes() reads.
NODES = [NodeSpec(cpus=2, memory_mb=1000), NodeSpec(cpus=1, memory_mb=900, gpus=2),
         NodeSpec(cpus=1, memory_mb=800)]


@pytest.fixture(scope="session")
def slurm_packages() -> None:
    """Fail (not skip) the test when the Slurm packages are not installed."""
    missing = missing_packages()
    if missing:
        pytest.fail(f"Debian packages {', '.join(missing)} are not installed: run "
                    "`bash setup.sh` (or apt-get install slurmctld slurmd slurm-client munge)",
                    pytrace=False)


@pytest.fixture(scope="module")
def slurm(slurm_packages):
    """A started stand-in cluster of NODES (``sn0``…``sn2``), shared by a module's tests;
    stopped afterwards, and checked to have left nothing behind."""
    cluster = StandInSlurm(NODES).start()
    try:
        yield cluster
    finally:
        cluster.stop()
        left = cluster.leftovers()
        assert not left, f"stand-in Slurm {cluster.tag} left {left}"
