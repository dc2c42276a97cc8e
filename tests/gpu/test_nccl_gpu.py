"""NCCL on a real GPU: emulated hosts on one GPU box are separate NCCL nodes joined by the
socket transport, a pipeline cell runs over NCCL on the emulated links, real compute trains on
the GPU. Skipped, with the reason, where torch sees no CUDA device (this project's CI machines
have none: there the CPU-side parts are tested in tests/runner/test_rank_jobs.py,
tests/train/test_nccl_cpu.py and tests/readout/test_nccl_log.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cudadevices import cuda_devices
from testbed.errors import WorkerError
from testbed.launch.command import RankJob, nccl_env, torchrun_env
from testbed.launch.loopback import free_port, run_local
from testbed.readout.nccl import transports
from testbed.readout.traces import load_traces, losses
from testbed.spec import Compute, ModelSpec, Parallel, Workload

pytestmark = [pytest.mark.torch, pytest.mark.skipif(
    "cuda_devices() == 0", reason="needs a CUDA device (torch.cuda.is_available())")]

ROOT = Path(__file__).resolve().parents[2]
PAIR = Path(__file__).with_name("nccl_pair.py")


def _pair(tmp_path: Path, host_ids: tuple[str, str]) -> tuple[list[int], list[str]]:
    """Run nccl_pair.py on two ranks over loopback with these NCCL host ids ("" = none);
    (exit statuses, logs)."""
    port, procs, logs = free_port(), [], []
    for rank in (0, 1):
        job = RankJob(rank, 2, "127.0.0.1", port, "lo", 60, host_id=host_ids[rank])
        defaults, identity = torchrun_env(job)
        env = {**os.environ, **defaults, **identity, **nccl_env(job)}
        log = tmp_path / f"rank{rank}.log"
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, str(PAIR)], env=env,
                                      stdout=log.open("w"), stderr=subprocess.STDOUT))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=60))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    return codes, [log.read_text(errors="replace") for log in logs]


def test_two_emulated_hosts_on_one_gpu_talk_over_nccls_socket_transport(tmp_path):
    codes, logs = _pair(tmp_path, ("cell-dc1-0", "cell-dc2-0"))
    assert codes == [0, 0], logs
    found = transports("\n".join(logs).splitlines())
    assert found == {"NET/Socket"}, (found, logs)


def test_without_host_ids_nccl_takes_the_ranks_for_one_node(tmp_path):
    # the reason for NCCL_HOSTID: the same two processes, no host id, are one node to NCCL,
    # which then never uses its network transport between them (on one GPU it refuses the
    # pair, on several it picks P2P or SHM)
    codes, logs = _pair(tmp_path, ("", ""))
    found = transports("\n".join(logs).splitlines())
    assert "NET/Socket" not in found, (codes, found)


REAL = Workload(model=ModelSpec(layers=4, hidden=64, heads=2, seq_len=32, vocab=128),
                parallel=Parallel(pp=2), schedule="1f1b", microbatches=4, iterations=6,
                warmup=1, lr=1e-2, compute=Compute(mode="real"), dist_backend="nccl")


@pytest.mark.skipif("cuda_devices() >= 2",
                    reason="every rank has a GPU of its own here")
def test_real_compute_on_ranks_sharing_one_gpu_is_refused_in_one_line(tmp_path):
    # on an H200, two ranks' real compute over NCCL on the one GPU hung in the first forward
    # (results/gpu/real-compute-hang.txt): refused rather than left to time out
    with pytest.raises(WorkerError, match="compute.mode: real over NCCL with 2 ranks sharing 1"):
        run_local(REAL, tmp_path, timeout_s=120)


@pytest.mark.skipif("cuda_devices() < 2", reason="needs two GPUs: one per rank")
def test_real_compute_trains_on_the_gpu_over_nccl(tmp_path):
    w = REAL
    run_local(w, tmp_path, timeout_s=180)
    got = losses(tmp_path)
    assert len(got) == 6 and got[-1] < 0.8 * got[0], got
    metas = [r for recs in load_traces(tmp_path).values() for r in recs if r["type"] == "meta"]
    assert {m["dist_backend"] for m in metas} == {"nccl"}
    assert all(m["device"].startswith("cuda") for m in metas)


@pytest.mark.root
@pytest.mark.slow
def test_a_two_dc_pipeline_cell_over_nccl_crosses_the_emulated_link(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root (namespaces, tc)")
    exp = tmp_path / "gpu.yaml"
    text = (ROOT / "experiments" / "gpu-nccl.yaml").read_text()
    exp.write_text(text.replace("workload.dist_backend: [nccl, gloo]",
                                "workload.dist_backend: [nccl]"))
    res = subprocess.run([sys.executable, "-m", "testbed", "run", str(exp), "--results",
                          str(tmp_path / "r"), "--quiet"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    (csv,) = (tmp_path / "r").glob("*/*/results.csv")
    row = pd.read_csv(csv, keep_default_na=False, na_values=[""]).iloc[0]
    assert row["status"] == "ok", (row["error"], res.stdout[-2000:], res.stderr[-2000:])
    assert row["dist_backend"] == "nccl"
    assert row["nccl_transports"] == "NET/Socket" and pd.isna(row["nccl_bypass"])
    # two emulated hosts, one rank each, take the machine's GPUs in rank order
    assert row["ranks_per_gpu"] == (2 if cuda_devices() == 1 else 1)
    # the activation crossed the shaped link: never faster than its delay (20 ms one way)
    assert 0.020 <= row["activation_readback_s"] < 2 * row["activation_readback_expected_s"], row
