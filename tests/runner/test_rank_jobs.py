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
from testbed.launch.command import program_env, worker_env
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


# ---------------------------------------------------------------- NCCL (issue: GPUs and NCCL)

def test_nccl_sees_one_node_per_emulated_host():
    # NCCL's host hash is the hostname and boot id, which namespaces share: without
    # NCCL_HOSTID every rank of this box would be one node and talk over P2P/SHM
    envs = _envs(_net(gpus=2))
    ids = [e["NCCL_HOSTID"] for e in envs]
    assert ids[0] == ids[1] and ids[2] == ids[3] and ids[0] != ids[2], ids
    assert all(e["NCCL_SOCKET_IFNAME"] == "eth0" and e["NCCL_IB_DISABLE"] == "1" for e in envs)
    assert all(e["NCCL_DEBUG"] == "INFO" and "INIT" in e["NCCL_DEBUG_SUBSYS"] for e in envs)


def test_host_ids_differ_between_cells_and_a_users_nccl_log_setting_wins(tmp_path):
    slots = in_order(TOPO, pp=2, dp=1)
    net = _net(gpus=1)
    a = worker_env(rank_job(net, slots[0], slots, 60, "cella"))
    b = worker_env(rank_job(net, slots[0], slots, 60, "cellb"))
    assert a["NCCL_HOSTID"] != b["NCCL_HOSTID"]
    job = rank_job(net, slots[0], slots, 60, "cella")
    env = program_env(job, {"NCCL_DEBUG": "WARN", "NCCL_HOSTID": "mine"}, PurePosixPath("c"),
                      PurePosixPath(tmp_path))
    assert env["NCCL_DEBUG"] == "WARN"  # the program's own log level
    assert env["NCCL_HOSTID"] == a["NCCL_HOSTID"]  # but never its host identity


def test_nccl_backend_needs_a_gpu_on_every_host(tmp_path):
    from testbed.launch.workers import _check_gpus_for_nccl
    from testbed.plan import plan_cell
    from testbed.spec import Experiment, Workload
    from testbed.spec.matrix import Cell
    exp = Experiment(name="n", topology=TOPO, workload=Workload(dist_backend="nccl",
                                                                parallel={"pp": 2}))
    plan = plan_cell(Cell(0, "c", {}, exp))
    with pytest.raises(WorkerError, match="dist_backend: nccl but host dc1-0 has no GPU"):
        _check_gpus_for_nccl(_net(gpus=0), plan)
    _check_gpus_for_nccl(_net(gpus=1), plan)  # a GPU each: no complaint


def test_real_compute_over_nccl_needs_a_gpu_per_rank_of_this_machine():
    from testbed.launch.workers import _check_gpus_for_nccl
    from testbed.plan import plan_cell
    from testbed.spec import Compute, Experiment, Workload
    from testbed.spec.matrix import Cell
    w = Workload(dist_backend="nccl", parallel={"pp": 2}, compute=Compute(mode="real"))
    plan = plan_cell(Cell(0, "c", {}, Experiment(name="n", topology=TOPO, workload=w)))
    # both emulated hosts are namespaces of this machine: 2 ranks, 1 GPU
    with pytest.raises(WorkerError, match="real over NCCL with 2 ranks sharing 1 GPU"):
        _check_gpus_for_nccl(_net(gpus=1), plan)
    _check_gpus_for_nccl(_net(gpus=2), plan)


def test_emulated_hosts_of_one_box_take_its_gpus_in_rank_order():
    # an 8-GPU box split into two DCs of 2 hosts × 2 ranks: every rank its own GPU
    topo = Topology(name="t", dcs=[{"name": "dc1", "hosts": 2}, {"name": "dc2", "hosts": 2}])
    net = FakeGpuNetwork(topology=topo, links=[], ledger=Ledger("tb000000"))
    net.gpus = 8
    for i, dc in enumerate(("dc1", "dc2"), start=1):
        for h in range(2):
            net.hosts[(dc, h)] = Node(f"{dc}-{h}", dc, f"ns-{dc}-{h}",
                                      ipaddress.IPv4Address(f"10.{i}.{h}.2"), "eth0", 0)
    slots = in_order(topo, pp=8, dp=1, ranks_per_host=2)
    envs = [worker_env(rank_job(net, s, slots, 60)) for s in slots]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == [str(r) for r in range(8)]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"] * 4
