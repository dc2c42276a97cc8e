"""A cell whose hosts include one whose interface towards the other DCs carries RDMA
(InfiniBand or RoCE) is refused before any rank starts when NCCL could carry its traffic,
unless the experiment opts in (``workload.unshaped_rdma``): NCCL over RDMA bypasses tc, so
the emulated links would not shape it (issue 31). Opted in, the ranks of such a host may use
RDMA (NCCL_IB_DISABLE is not set there). No root, no processes.

No machine this runs on has InfiniBand or RoCE (CI machines neither), so the network here is
a stand-in whose ``rdma_interface`` answers ``ib0`` for one host, and whose GPU count is
given: the two things faked. The experiments, plans, jobs and environments are the real ones.
"""
from __future__ import annotations

import ipaddress
import pytest
import yaml

from testbed.errors import EXIT_BAD_INPUT, RefusedError
from testbed.launch.command import worker_env
from testbed.launch.rdma import rdma_exposed, unshaped_rdma_hosts
from testbed.launch.workers import rank_job, start_workers
from testbed.net.ledger import Ledger
from testbed.net.network import Network, Node
from testbed.plan import CellPlan, plan_all
from testbed.spec import load_experiment

RDMA_HOST = "dcb-0"


class RdmaNetwork(Network):
    """A network of two hosts, ``dca-0`` and ``dcb-0``; ``dcb-0``'s interface towards the
    other DC answers as InfiniBand (``ib0``), each host has ``gpus`` GPUs. ``put`` and
    ``start`` record what they were asked, so a test can see that nothing started."""

    gpus: int = 0
    rdma: dict[str, str] = {}
    started: list[str] = []

    def rdma_interface(self, node: Node) -> str | None:
        return self.rdma.get(node.name)

    def gpu_count(self, node: Node) -> int:
        return self.gpus

    def netns_file(self, node: Node) -> str | None:
        return None  # lab hosts: nothing of them is a namespace here

    def put(self, node, local, there) -> None:
        self.started.append(f"put {node.name}")

    def start(self, node, argv, env, log_file, outputs=(), cwd=None):
        self.started.append(f"start {node.name}")
        raise AssertionError("a rank was started")


def _plan(tmp_path, **workload) -> CellPlan:
    exp = {"name": "rdma", "backend": "remote",
           "remote": {"inventory": "inventory.ini"},
           "topology": {"name": "two", "dcs": [{"name": "dca", "hosts": 1},
                                              {"name": "dcb", "hosts": 1}],
                        "inter_dc": {"rate_mbit": 1000}},
           "workload": {"parallel": {"pp": 2, "dp": 1}, "microbatches": 2, "iterations": 2,
                        "compute": {"mode": "emulated", "forward_ms": 1, "backward_ms": 2},
                        **workload},
           "measure_links": False}
    if "program" in workload:
        (tmp_path / "train.py").write_text("print('hello')\n")
    path = tmp_path / "rdma.yaml"
    path.write_text(yaml.safe_dump(exp))
    (plan,) = plan_all(load_experiment(path))
    return plan


def _net(plan: CellPlan, gpus: int = 0, rdma: dict[str, str] | None = None) -> RdmaNetwork:
    net = RdmaNetwork(topology=plan.experiment.topology, links=[], ledger=Ledger("tb000000"))
    net.gpus, net.rdma, net.started = gpus, {RDMA_HOST: "ib0"} if rdma is None else rdma, []
    for i, dc in enumerate(("dca", "dcb"), start=1):
        net.hosts[(dc, 0)] = Node(f"{dc}-0", dc, f"{dc}-0", ipaddress.IPv4Address(f"10.{i}.0.2"),
                                  "ib0" if f"{dc}-0" == RDMA_HOST else "eth0", 0)
    return net


@pytest.mark.parametrize("workload, gpus, why", [
    ({"dist_backend": "nccl"}, 0, "workload.dist_backend is nccl"),
    ({"dist_backend": "auto"}, 8, "workload.dist_backend is auto and the host has 8 GPU(s)"),
    ({"program": {"argv": ["python", "train.py"]}}, 0,
     "workload.program is set (a program may use NCCL)"),
])
def test_a_host_with_rdma_is_refused_where_nccl_could_carry_the_traffic(tmp_path, workload,
                                                                       gpus, why):
    plan = _plan(tmp_path, **workload)
    with pytest.raises(RefusedError) as e:
        unshaped_rdma_hosts(_net(plan, gpus), plan)
    msg = str(e.value)
    assert e.value.exit_code == EXIT_BAD_INPUT == 2
    assert "\n" not in msg
    assert f"cell {plan.cell.cell_id} refused: host dcb-0 reaches the other DCs over ib0, " \
           f"an InfiniBand/RoCE (RDMA) interface, and {why}." in msg
    assert "bypasses the kernel's qdiscs (tc), so the emulated links would not shape it" in msg
    assert "Set workload.unshaped_rdma: true to run anyway" in msg
    assert "dca-0" not in msg  # the host without RDMA is not named


@pytest.mark.parametrize("workload, gpus", [
    ({"dist_backend": "gloo"}, 8),  # gloo's TCP over IPoIB passes tc
    ({"dist_backend": "auto"}, 0),  # auto is gloo on a host without GPUs
])
def test_a_cell_nccl_cannot_reach_runs_shaped_on_an_rdma_host(tmp_path, workload, gpus):
    plan = _plan(tmp_path, **workload)
    assert unshaped_rdma_hosts(_net(plan, gpus), plan) == []


def test_hosts_without_rdma_are_never_refused(tmp_path):
    plan = _plan(tmp_path, dist_backend="nccl")
    assert rdma_exposed(_net(plan, 8, rdma={}), plan) == {}
    # the namespaces' answer (netns, Mininet: veth), whatever the host
    plain = Network(topology=plan.experiment.topology, links=[], ledger=Ledger("tb000000"))
    assert plain.rdma_interface(_net(plan).host("dcb", 0)) is None


def test_refused_before_any_rank_starts(tmp_path):
    plan = _plan(tmp_path, dist_backend="nccl")
    net = _net(plan)
    with pytest.raises(RefusedError):
        start_workers(net, plan, None, None)
    assert net.started == []


def test_opted_in_ranks_on_the_rdma_host_may_use_it_and_nothing_else_changes(tmp_path):
    plan = _plan(tmp_path, dist_backend="nccl", unshaped_rdma=True)
    net = _net(plan)
    unshaped = unshaped_rdma_hosts(net, plan)
    assert unshaped == [RDMA_HOST]
    jobs = {net.host(*s.host).name: rank_job(net, s, plan.slots, 60, "c0", unshaped)
            for s in plan.slots}
    assert jobs[RDMA_HOST].rdma_allowed and not jobs["dca-0"].rdma_allowed
    env_rdma, env_plain = worker_env(jobs[RDMA_HOST]), worker_env(jobs["dca-0"])
    assert "NCCL_IB_DISABLE" not in env_rdma
    assert env_plain["NCCL_IB_DISABLE"] == "1"
    assert env_rdma["NCCL_SOCKET_IFNAME"] == "ib0"  # bootstrap and fallback stay on it
    # by default (no hosts opted in) every rank keeps NCCL off RDMA
    assert not rank_job(net, plan.slots[1], plan.slots, 60, "c0").rdma_allowed
