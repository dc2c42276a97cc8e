"""``backend: cluster`` end to end on two stand-in machines: DCs on different machines joined by
a VXLAN tunnel, shaped as on one box, the same experiment's results as on ``backend: netns``;
nothing left on any machine after a run (after a SIGKILL: test_cluster_sigkill.py)."""
from __future__ import annotations

import pytest

from clusterrun import (BUBBLE_TOLERANCE, DELAY_MS, ITERATION_TOLERANCE, RATE_MBIT,
                        RTT_TOLERANCE, experiment, leftovers, run, run_tags)

pytestmark = [pytest.mark.root, pytest.mark.remote, pytest.mark.torch, pytest.mark.slow]


def machine_ns(machines) -> list[str]:
    return [h.ns for h in machines.hosts]


@pytest.mark.alone  # RTT, rate and iteration time against one box's: measured time
@pytest.mark.apart_from_quiet
def test_cluster_run_matches_netns_and_leaves_nothing(machines, machine_files, netns_row,
                                                      tmp_path):
    _, row = run(experiment("cluster", machine_files), tmp_path / "cluster")
    assert row["status"] == "ok", row["error"]
    assert row["cluster_machines"] == "machines-0:dc1 machines-1:dc2"
    assert row["tunnel_mtu"] == 1500
    assert row["underlay_rtt_ms"] < 1 and row["underlay_rate_mbit"] > 10 * RATE_MBIT
    rtt = row["link_dc1-dc2_rtt_ms_measured"]
    assert abs(rtt - 2 * DELAY_MS) <= RTT_TOLERANCE * 2 * DELAY_MS, rtt
    assert row["link_dc1-dc2_rate_mbit_measured"] <= RATE_MBIT * 1.02
    tags = run_tags(tmp_path / "cluster")
    assert len(tags) == 3, tags  # the network's and each machine's share's
    assert not leftovers(tags, machine_ns(machines))
    local = netns_row
    gap = abs(row["iteration_time_s"] / local["iteration_time_s"] - 1)
    assert gap <= ITERATION_TOLERANCE, (row["iteration_time_s"], local["iteration_time_s"])
    assert abs(row["bubble_ratio"] - local["bubble_ratio"]) <= BUBBLE_TOLERANCE
