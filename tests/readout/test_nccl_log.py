"""The NCCL columns of a row, read from what NCCL and the worker recorded on a GPU machine.

``nccl-logs/`` and ``nccl-cell/`` were recorded on an NVIDIA H200 (torch 2.11.0+cu130, NCCL
2.28.9) by this project's own runs: two ranks with different NCCL host ids on the one GPU
(tests/gpu/test_nccl_gpu.py), and the nccl cell of experiments/gpu-nccl.yaml as
benchmarks/bench_gpu.py ran it (the cell directory's cell file, traces and rank logs). The two
lines in ``SHARED_MEMORY`` are NCCL's own format for connections inside one node, as NCCL
prints them (quoted from a public NCCL issue, NVIDIA/nccl#690): no run here made one.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from testbed.plan import plan_cell
from testbed.readout.nccl import nccl_columns, ranks_per_gpu, transports
from testbed.spec.load import load_experiment

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
SHARED_MEMORY = [
    "node0:13572:13572 [1] NCCL INFO Channel 00 : 2[1] -> 0[0] via SHM/direct/direct",
    "node0:13572:13572 [1] NCCL INFO Channel 00/0 : 10[2] -> 9[1] via P2P/IPC/read",
]


def test_the_transports_nccl_named_in_its_own_log():
    for rank in (0, 1):
        lines = (HERE / "nccl-logs" / f"two-hosts-one-gpu-rank{rank}.log").read_text().splitlines()
        assert transports(lines) == {"NET/Socket"}  # "via NET/Socket/0/Shared"
    assert transports(SHARED_MEMORY) == {"SHM/direct", "P2P/IPC"}
    assert transports(["NCCL INFO NET/Socket : Using [0]eth0:10.1.0.10<0>"]) == set()


def _nccl_plan():
    loaded = load_experiment(ROOT / "experiments" / "gpu-nccl.yaml")
    (cell,) = [c for c in loaded.cells if c.params["workload.dist_backend"] == "nccl"]
    return plan_cell(cell)


def test_a_recorded_nccl_cell_reads_as_socket_only_with_its_read_back(tmp_path):
    cell = tmp_path / "cell"
    shutil.copytree(HERE / "nccl-cell", cell)
    got = nccl_columns(_nccl_plan(), cell)
    assert got["dist_backend"] == "nccl"
    assert got["nccl_transports"] == "NET/Socket" and got["nccl_bypass"] == ""
    assert got["ranks_per_gpu"] == 2  # both emulated hosts' ranks on the machine's one GPU
    # 20 ms one way + 4 MiB at 10 Gbit/s (Ethernet frames: 1514 bytes per 1448 of payload)
    assert got["activation_readback_expected_s"] == pytest.approx(
        0.020 + 4 * 2**20 * 1514 / 1448 * 8 / 10e9, abs=1e-6)
    assert got["activation_readback_s"] == pytest.approx(0.026083, abs=1e-6)  # as recorded
    assert got["activation_readback_error_pct"] == pytest.approx(10.95, abs=0.01)


def test_a_shared_memory_connection_of_a_rank_alone_on_its_host_is_a_bypass(tmp_path):
    cell = tmp_path / "cell"
    shutil.copytree(HERE / "nccl-cell", cell)
    with (cell / "worker-rank1.log").open("a") as f:
        f.write("\n".join(SHARED_MEMORY) + "\n")
    got = nccl_columns(_nccl_plan(), cell)
    assert got["nccl_bypass"] == "P2P/IPC;SHM/direct"
    assert got["nccl_transports"] == "NET/Socket;P2P/IPC;SHM/direct"


def test_a_cell_that_never_used_nccl_has_empty_columns(tmp_path):
    got = nccl_columns(_nccl_plan(), tmp_path)
    assert got["nccl_transports"] == "" and got["activation_readback_s"] is None
    assert got["ranks_per_gpu"] is None


def _meta(rank: int, host: str, device: str, visible: str | None) -> dict[int, list[dict]]:
    return {rank: [{"type": "meta", "rank": rank, "host": host, "device": device,
                    "cuda_visible_devices": visible}]}


@pytest.mark.parametrize("metas, want", [
    # one GPU each: the runner's CUDA_VISIBLE_DEVICES, or all visible and cuda:<local rank>
    ([("vm", "cuda:0", "0"), ("vm", "cuda:0", "1")], 1),
    ([("vm", "cuda:0", None), ("vm", "cuda:1", None)], 1),
    ([("vm", "cuda:1", "0,3"), ("vm", "cuda:0", "3")], 2),  # both on physical GPU 3
    ([("a", "cuda:0", "0"), ("b", "cuda:0", "0")], 1),      # two machines' GPU 0
    ([("vm", "cuda:0", "0")] * 3, 3),
    ([("vm", "cpu", None), ("vm", "cpu", None)], None),
])
def test_ranks_per_gpu_counts_the_ranks_on_one_gpu_of_one_machine(metas, want):
    traces = {}
    for rank, (host, device, visible) in enumerate(metas):
        traces.update(_meta(rank, host, device, visible))
    assert ranks_per_gpu(traces) == want
