"""Two ranks per lab host through the stand-in lab hosts (sshd in namespaces): both ranks of a
host start there over SSH, share its run directory without mixing their files, come back with
their own traces, and teardown stops both; lab hosts report their GPUs when the lab opens."""
from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import pytest

from testbed.net.network import local_gpu_count
from testbed.net.backends.remote import RemoteBackend
from testbed.net.lab.lab import Lab, gpu_count
from testbed.topology import Topology

from test_remote_run import experiment, only_row, remote_processes, run

pytestmark = [pytest.mark.root, pytest.mark.remote]
DCS = ["dc1", "dc2"]


@pytest.mark.torch
@pytest.mark.slow
def test_two_ranks_per_lab_host_run_and_leave_nothing(lab, inventory, known_hosts, tmp_path):
    exp = experiment("remote", inventory, known_hosts)  # no delay: the hosts lack netem
    exp["name"] = "lab-rph"
    exp["measure_links"] = False
    # pp=4 on one host per DC: ranks 0, 1 on dc1-0 and ranks 2, 3 on dc2-0
    exp["topology"]["dcs"] = [{"name": "dc1", "hosts": 1}, {"name": "dc2", "hosts": 1}]
    exp["workload"]["ranks_per_host"] = 2
    res, root = run(exp, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    row, d = only_row(root)
    assert row["status"] == "ok", row["error"]
    cell = d / "cells" / row["cell_id"]
    labinfo = json.loads((cell / "net" / "lab.json").read_text())
    assert sorted(labinfo["hosts"]) == ["dc1-0", "dc2-0"]
    # the stand-ins are namespaces of this machine: they see its GPUs, i.e. none here
    assert labinfo["gpus"] == {h: local_gpu_count() for h in ("dc1-0", "dc1-1", "dc2-0",
                                                              "dc2-1")}
    told = []
    for r in range(4):
        with open(cell / f"trace-rank{r}.jsonl") as f:
            meta = json.loads(f.readline())
        assert meta["rank"] == r and "clock_offset_ns" in meta  # fetched from its lab host
        told.append((meta["local_rank"], meta["local_world_size"]))
        assert (cell / f"worker-rank{r}.log").is_file()
    assert told == [(0, 2), (1, 2), (0, 2), (1, 2)]
    assert row["iterations_measured"] == 4
    assert remote_processes(lab) == []


@pytest.mark.slow
def test_teardown_stops_both_processes_of_a_shared_host(lab, inventory, known_hosts, tmp_path):
    opened = Lab.open(inventory, DCS, known_hosts, clock_samples=1)
    topo = Topology(name="t", dcs=[{"name": "dc1", "hosts": 1}, {"name": "dc2", "hosts": 1}],
                    inter_dc={"rate_mbit": 1000})
    try:
        with ExitStack() as stack:
            net, _ = RemoteBackend(lab=opened).bring_up(topo, topo.resolved_links(), "htb",
                                                        tmp_path / "net", stack)
            node = net.host("dc1", 0)
            logs = [stack.enter_context(open(tmp_path / f"r{i}.log", "wb")) for i in (0, 1)]
            procs = [net.start(node, ["sleep", "300"], {"LOCAL_RANK": str(i)}, logs[i])
                     for i in (0, 1)]
            assert all(p.pid and p.poll() is None for p in procs)
            assert len(remote_processes(lab)) == 2
        assert all(p.returncode is not None for p in procs)
        assert remote_processes(lab) == []
        run_dir = Path(net.run_dir)
        assert not run_dir.exists()  # the stand-ins share this machine's file system
    finally:
        opened.close()


def test_gpus_are_counted_over_ssh_from_device_files(lab, inventory, known_hosts, tmp_path):
    # no GPU here: numbered files in a temporary directory stand in for /dev/nvidia<N>; the
    # probe itself runs on the lab host over SSH as it does when a lab opens
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    opened = Lab.open(inventory, DCS, known_hosts, clock_samples=1)
    try:
        host = opened.hosts()[0]
        conn = opened.conns[host.name]
        assert gpu_count(conn, host, str(tmp_path / "nvidia[0-9]*")) == 2
        assert gpu_count(conn, host, str(tmp_path / "absent[0-9]*")) == 0
        assert opened.gpus == {h.name: local_gpu_count() for h in opened.hosts()}
    finally:
        opened.close()
