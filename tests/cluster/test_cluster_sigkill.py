"""``backend: cluster`` on two stand-in machines: nothing left on any machine after a SIGKILL of
the controller and of the machines' agents, plus ``clean``. Apart from test_cluster_run.py,
whose first test runs alone: a module is one work unit of ``--dist loadgroup`` (its stand-in
machines are module-scoped), so this test, which needs no quiet machine, would otherwise run in
the serial first phase of the suite while every other worker waits."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clusterrun import (experiment, gone, kill_controller_and_agents, leftovers, spread_tags,
                        wait_for_workers, write)

pytestmark = [pytest.mark.root, pytest.mark.remote, pytest.mark.torch, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def machine_ns(machines) -> list[str]:
    return [h.ns for h in machines.hosts]


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
