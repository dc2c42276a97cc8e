"""Hosts whose traffic to the other DCs NCCL could carry over RDMA, which tc cannot shape
(issue 31): refused unless the experiment opts in (``workload.unshaped_rdma``).

On a lab host whose interface towards the other DCs is InfiniBand or RoCE
(``Network.rdma_interface``), NCCL moves its data with RDMA verbs: the NIC reads and writes
the ranks' memory itself, and the kernel's qdiscs, where every shaper of testbed sits, never
see a packet. The emulated link's delay, rate and loss would then not apply to NCCL's traffic.
``NCCL_IB_DISABLE=1`` (``testbed.launch.command.nccl_env``) keeps NCCL on sockets, but a
user's program may set its own NCCL environment, so such a cell is refused outright where
NCCL could carry its traffic at all:

- ``workload.program`` is set: a program may use NCCL whatever testbed tells it;
- ``workload.dist_backend: nccl``;
- ``workload.dist_backend: auto`` on a host with GPUs (auto is nccl where a rank has one).

With ``workload.unshaped_rdma: true`` the cell runs, NCCL may use RDMA on those hosts
(``RankJob.rdma_allowed``), and the row lists them in ``unshaped_rdma_hosts``.
"""
from __future__ import annotations

from testbed.errors import RefusedError
from testbed.net.network import Network
from testbed.plan import CellPlan
from testbed.spec import Workload


def nccl_reason(workload: Workload, gpus: int) -> str | None:
    """Why NCCL could carry the traffic of a host with ``gpus`` GPUs; None where it cannot
    (the built-in worker with gloo)."""
    if workload.program is not None:
        return "workload.program is set (a program may use NCCL)"
    if workload.dist_backend == "nccl":
        return "workload.dist_backend is nccl"
    if workload.dist_backend == "auto" and gpus > 0:
        return f"workload.dist_backend is auto and the host has {gpus} GPU(s)"
    return None


def rdma_exposed(net: Network, plan: CellPlan) -> dict[str, tuple[str, str]]:
    """The cell's hosts whose traffic to the other DCs NCCL could carry over RDMA, in rank
    order: host name → (its RDMA interface, why NCCL could use it)."""
    out: dict[str, tuple[str, str]] = {}
    for slot in plan.slots:
        node = net.host(*slot.host)
        if node.name in out:
            continue
        iface = net.rdma_interface(node)
        why = nccl_reason(plan.experiment.workload, net.gpu_count(node)) if iface else None
        if iface and why:
            out[node.name] = (iface, why)
    return out


def unshaped_rdma_hosts(net: Network, plan: CellPlan) -> list[str]:
    """The cell's hosts on which NCCL may use RDMA, unshaped (empty when none). Raises
    RefusedError naming every such host when the experiment did not opt in
    (``workload.unshaped_rdma``)."""
    exposed = rdma_exposed(net, plan)
    if exposed and not plan.experiment.workload.unshaped_rdma:
        hosts = "; ".join(f"host {h} reaches the other DCs over {iface}, an InfiniBand/RoCE "
                          f"(RDMA) interface, and {why}" for h, (iface, why) in exposed.items())
        raise RefusedError(
            f"cell {plan.cell.cell_id} refused: {hosts}. NCCL's RDMA traffic bypasses the "
            "kernel's qdiscs (tc), so the emulated links would not shape it. Set "
            "workload.unshaped_rdma: true to run anyway, NCCL on RDMA unshaped there (the row "
            "lists those hosts in unshaped_rdma_hosts), or use hosts whose testbed_iface is "
            "plain Ethernet")
    return list(exposed)
