"""``backend: cluster`` under Slurm (a stand-in slurmctld and one slurmd per node namespace):
outside an allocation the run says so, and after a SIGKILL of the controller and the agents
``clean`` run in a new allocation leaves nothing. Apart from test_cluster_slurm.py, whose first
test runs alone: a module is one work unit of ``--dist loadgroup`` (its Slurm cluster is
module-scoped), so these tests, which need no quiet machine, would otherwise run in the serial
first phase of the suite while every other worker waits."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clusterrun import (experiment, gone, kill_controller_and_agents, leftovers, spread_tags,
                        wait_for_workers, write)

pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
SALLOC = ["salloc", "-N2", "--exclusive", "--quiet"]


def node_ns(slurm_nodes) -> list[str]:
    return [n.ns for n in slurm_nodes.nodes]


def test_outside_an_allocation_the_run_says_so(slurm_nodes, tmp_path):
    path = write(experiment("cluster", slurm=True), tmp_path)
    res = subprocess.run([sys.executable, "-m", "testbed", "run", str(path), "--results",
                          str(tmp_path / "r")], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env=slurm_nodes.env())
    assert res.returncode == 3, res.stdout + res.stderr
    assert "not inside a Slurm allocation" in res.stderr and "Traceback" not in res.stderr


def test_sigkill_then_clean_in_a_new_allocation_leaves_nothing(slurm_nodes, tmp_path):
    exp = write(experiment("cluster", iterations=200, slurm=True), tmp_path)
    proc = subprocess.Popen([*SALLOC, sys.executable, "-m", "testbed", "run", str(exp),
                             "--results", str(tmp_path / "results"), "--quiet"], cwd=ROOT,
                            env=slurm_nodes.env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    spread = None
    try:
        spread = wait_for_workers(lambda led: "slurm_job" in led["machines"],
                                  node_ns(slurm_nodes))
        kill_controller_and_agents(spread)
        proc.wait(timeout=60)  # salloc ends the job: Slurm stops the steps, not the shares
        assert leftovers(spread_tags(spread), node_ns(slurm_nodes)), "nothing left: no test"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        # this run's network only: a bare clean would also take other tests' kept networks
        own = ["--tag", spread["tag"]] if spread else []
        res = subprocess.run([*SALLOC, sys.executable, "-m", "testbed", "clean", *own], cwd=ROOT,
                             env=slurm_nodes.env(), capture_output=True, text=True,
                             timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert not leftovers(spread_tags(spread), node_ns(slurm_nodes))
    for node, tag in spread["machines"]["tags"].items():  # each node's own clean, with srun
        assert f"removed {spread['tag']} on {node} ({tag})" in res.stdout, res.stdout
    assert gone(spread)
