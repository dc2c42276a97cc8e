"""What each rank is told about the host it shares with other ranks: LOCAL_RANK,
LOCAL_WORLD_SIZE and, where the host has GPUs, CUDA_VISIBLE_DEVICES. No root, no processes.

This machine has no GPU. Where a test needs a host with GPUs it fakes only that host's GPU
count (``Network.gpu_count`` overridden, or device files in a temporary directory); the
placement, the jobs and the environments are the real ones.
"""
from __future__ import annotations

import ipaddress
from pathlib import PurePosixPath

import pytest

from testbed.errors import WorkerError
from testbed.launch.command import worker_env
from testbed.net.ledger import Ledger
from testbed.net.network import GPU_DEVICES, Network, Node, local_gpu_count
from testbed.plan.placement import in_order
from testbed.launch.workers import rank_job
from testbed.topology import Topology

TOPO = Topology(name="t", dcs=[{"name": "dc1", "hosts": 1}, {"name": "dc2", "hosts": 1}])


class FakeGpuNetwork(Network):
    """A network whose hosts report ``gpus`` GPUs each: the one thing faked, since this
    machine has none. Its hosts are namespaces of this machine (``netns_file``), as the netns
    backend's are; no namespace is made, since nothing is started."""

    gpus: int = 0

    def gpu_count(self, node: Node) -> int:
        return self.gpus

    def netns_file(self, node: Node) -> str | None:
        return f"/run/netns/{node.ns}"


def _net(gpus: int) -> Network:
    net = FakeGpuNetwork(topology=TOPO, links=[], ledger=Ledger("tb000000"))
    net.gpus = gpus
    for i, dc in enumerate(("dc1", "dc2"), start=1):
        net.hosts[(dc, 0)] = Node(f"{dc}-0", dc, f"ns-{dc}", ipaddress.IPv4Address(f"10.{i}.0.2"),
                                  "eth0", 0)
    return net


def _envs(net: Network) -> list[dict[str, str]]:
    slots = in_order(TOPO, pp=4, dp=1, ranks_per_host=2)
    return [worker_env(rank_job(net, s, slots, 60)) for s in slots]


def test_two_ranks_per_host_get_local_ranks_and_one_gpu_each():
    envs = _envs(_net(gpus=2))
    assert [(e["RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["CUDA_VISIBLE_DEVICES"])
            for e in envs] == [("0", "0", "2", "0"), ("1", "1", "2", "1"),
                               ("2", "0", "2", "0"), ("3", "1", "2", "1")]
    assert {e["MASTER_ADDR"] for e in envs} == {"10.1.0.2"}  # rank 0's host


def test_a_host_without_gpus_leaves_cuda_visible_devices_alone():
    envs = _envs(_net(gpus=0))
    assert all("CUDA_VISIBLE_DEVICES" not in e for e in envs)
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]


def test_a_host_with_fewer_gpus_than_ranks_is_refused():
    with pytest.raises(WorkerError, match="host dc1-0 has 1 GPU.* for 2 ranks: lower "
                                          "workload.ranks_per_host to 1"):
        _envs(_net(gpus=1))


def test_gpus_are_counted_from_numbered_device_files(tmp_path):
    # device files made here stand in for /dev/nvidia*: the control devices do not count
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert local_gpu_count(str(tmp_path / "nvidia[0-9]*")) == 3
    assert local_gpu_count(str(tmp_path / "none[0-9]*")) == 0
    assert GPU_DEVICES == "/dev/nvidia[0-9]*"


def test_ranks_get_torchruns_node_variables_and_one_thread_on_a_shared_machine():
    envs = _envs(_net(gpus=0))
    assert [(e["GROUP_RANK"], e["GROUP_WORLD_SIZE"], e["ROLE_RANK"]) for e in envs] == [
        ("0", "2", "0"), ("0", "2", "1"), ("1", "2", "2"), ("1", "2", "3")]
    # four ranks share this machine's cores, as under torchrun --nproc_per_node 4
    assert {e["OMP_NUM_THREADS"] for e in envs} == {"1"}
    assert {e["TORCHELASTIC_RUN_ID"] for e in envs} == {"none"}


def test_a_programs_own_env_wins_over_torchruns_defaults_but_not_its_identity():
    from testbed.launch.command import program_env
    slots = in_order(TOPO, pp=2, dp=1)
    job = rank_job(_net(gpus=0), slots[1], slots, 60, "c0ffee")
    env = program_env(job, {"OMP_NUM_THREADS": "4", "RANK": "7"}, PurePosixPath("/c/cell.json"),
                      PurePosixPath("/c"))
    assert env["OMP_NUM_THREADS"] == "4" and env["RANK"] == "1"
    assert env["TORCHELASTIC_ERROR_FILE"] == "/c/error-rank1.json"
    assert env["TORCHELASTIC_RUN_ID"] == "c0ffee"
