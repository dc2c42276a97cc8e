"""``backend: cluster`` end to end on two stand-in machines: DCs on different machines joined by
a VXLAN tunnel, shaped as on one box, the same experiment's results as on ``backend: netns``;
nothing left on any machine after a run, and after a SIGKILL of the controller (and of the
machines' agents) plus ``clean``."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clusterrun import (BUBBLE_TOLERANCE, DELAY_MS, ITERATION_TOLERANCE, RATE_MBIT,
                        RTT_TOLERANCE, experiment, gone, kill_controller_and_agents, leftovers,
                        run, run_tags, spread_tags, wait_for_workers, write)

pytestmark = [pytest.mark.root, pytest.mark.remote, pytest.mark.torch, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def machine_ns(machines) -> list[str]:
    return [h.ns for h in machines.hosts]


@pytest.mark.alone  # RTT, rate and iteration time against one box's: measured time
def test_cluster_run_matches_netns_and_leaves_nothing(machines, machine_files, tmp_path):
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
    _, local = run(experiment("netns"), tmp_path / "netns")
    assert local["status"] == "ok", local["error"]
    gap = abs(row["iteration_time_s"] / local["iteration_time_s"] - 1)
    assert gap <= ITERATION_TOLERANCE, (row["iteration_time_s"], local["iteration_time_s"])
    assert abs(row["bubble_ratio"] - local["bubble_ratio"]) <= BUBBLE_TOLERANCE


def test_sigkill_of_controller_and_agents_then_clean_leaves_nothing(machines, machine_files,
                                                                   tmp_path):
    exp = experiment("cluster", machine_files, iterations=200)
    proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", str(write(exp, tmp_path)),
                             "--results", str(tmp_path / "results"), "--quiet"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    spread = None
    try:
        spread = wait_for_workers(lambda led: led["owner_pid"] == proc.pid, machine_ns(machines))
        kill_controller_and_agents(spread)
        proc.wait(timeout=10)
        assert leftovers(spread_tags(spread), machine_ns(machines)), "nothing left: no test"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        # this run's network only: a bare clean would also take other tests' kept networks
        own = ["--tag", spread["tag"]] if spread else []
        res = subprocess.run([sys.executable, "-m", "testbed", "clean", *own], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert not leftovers(spread_tags(spread), machine_ns(machines))
    # stand-in machines share this box's /run: a clean here would also find their ledgers;
    # that each machine's own clean, reached over SSH, removed its share is in the output
    for machine, tag in spread["machines"]["tags"].items():
        assert f"removed {spread['tag']} on {machine} ({tag})" in res.stdout, res.stdout
    assert gone(spread)
    assert not Path(spread["machines"]["run_dir"]).exists()  # the machines' share this /tmp
