"""``backend: cluster`` under Slurm: inside a real allocation (a stand-in slurmctld and one
slurmd per node namespace), the machines are the job's nodes and every per-node part starts
with srun. The same experiment as on one box and over SSH, only ``cluster`` changed; nothing
left after the run (outside an allocation, and after a SIGKILL: test_cluster_slurm_kill.py)."""
from __future__ import annotations

import pytest

from clusterrun import (BUBBLE_TOLERANCE, DELAY_MS, ITERATION_TOLERANCE, RTT_TOLERANCE,
                        experiment, leftovers, run, run_tags)

pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.slow]
SALLOC = ["salloc", "-N2", "--exclusive", "--quiet"]


def node_ns(slurm_nodes) -> list[str]:
    return [n.ns for n in slurm_nodes.nodes]


@pytest.mark.alone  # RTT and iteration time against one box's: measured time
@pytest.mark.apart_from_quiet
def test_slurm_run_matches_netns_and_leaves_nothing(slurm_nodes, netns_row, tmp_path):
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
    local = netns_row
    gap = abs(row["iteration_time_s"] / local["iteration_time_s"] - 1)
    assert gap <= ITERATION_TOLERANCE, (row["iteration_time_s"], local["iteration_time_s"])
    assert abs(row["bubble_ratio"] - local["bubble_ratio"]) <= BUBBLE_TOLERANCE
