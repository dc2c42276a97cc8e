"""``backend: cluster`` under Slurm: inside a real allocation (a stand-in slurmctld and one
slurmd per node namespace), the machines are the job's nodes and every per-node part starts
with srun. The same experiment as on one box and over SSH, only ``cluster`` changed; nothing
left after the run, and after a SIGKILL of the controller and the agents plus ``clean`` run in
a new allocation."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clusterrun import (BUBBLE_TOLERANCE, DELAY_MS, ITERATION_TOLERANCE, RTT_TOLERANCE,
                        experiment, gone, kill_controller_and_agents, leftovers, run, run_tags,
                        spread_tags, wait_for_workers, write)

pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
SALLOC = ["salloc", "-N2", "--exclusive", "--quiet"]


def node_ns(slurm_nodes) -> list[str]:
    return [n.ns for n in slurm_nodes.nodes]


@pytest.mark.alone  # RTT and iteration time against one box's: measured time
def test_slurm_run_matches_netns_and_leaves_nothing(slurm_nodes, tmp_path):
    _, row = run(experiment("cluster", slurm=True), tmp_path / "slurm", SALLOC,
                 slurm_nodes.env())
    assert row["status"] == "ok", row["error"]
    assert row["cluster_machines"] == "sn0:dc1 sn1:dc2"
    assert row["tunnel_mtu"] == 1450  # the stand-in nodes' underlay is 1500 bytes
    rtt = row["link_dc1-dc2_rtt_ms_measured"]
    assert abs(rtt - 2 * DELAY_MS) <= RTT_TOLERANCE * 2 * DELAY_MS, rtt
    tags = run_tags(tmp_path / "slurm")
    assert len(tags) == 3, tags  # the network's and each node's share's
    assert not leftovers(tags, node_ns(slurm_nodes))
    _, local = run(experiment("netns"), tmp_path / "netns")
    gap = abs(row["iteration_time_s"] / local["iteration_time_s"] - 1)
    assert gap <= ITERATION_TOLERANCE, (row["iteration_time_s"], local["iteration_time_s"])
    assert abs(row["bubble_ratio"] - local["bubble_ratio"]) <= BUBBLE_TOLERANCE


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
