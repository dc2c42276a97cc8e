"""The built-in worker's NCCL path, what of it runs without a GPU: the backend each cell
resolves, the schedules whose transfer order NCCL can match, the refusal of what is not built,
and a nccl cell on a machine without CUDA failing in one line. The GPU side is
tests/gpu/test_nccl_gpu.py (skipped here: this machine has no GPU)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pydantic
import pytest

from cudadevices import cuda_devices
from testbed.errors import WorkerError
from testbed.launch.loopback import run_local
from testbed.schedule.generators import generate
from testbed.schedule.ir import Kind
from testbed.schedule.lower import lower
from testbed.spec import Compute, ModelSpec, Parallel, Workload

ROOT = Path(__file__).resolve().parents[2]
# testbed.train.nccl imports torch: the tests import it themselves, so that collecting this
# module does not (tests/cudadevices.py)
no_cuda = pytest.mark.skipif("cuda_devices() > 0", reason="this machine has CUDA")


@no_cuda
def test_auto_is_gloo_without_cuda_and_nccl_without_cuda_is_refused():
    from testbed.train.nccl import resolve_backend
    assert resolve_backend("auto") == "gloo" and resolve_backend("gloo") == "gloo"
    with pytest.raises(RuntimeError, match="dist_backend: nccl but this rank sees no CUDA"):
        resolve_backend("nccl")


@pytest.mark.parametrize("name,chunks", [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)])
def test_nccl_matches_the_transfer_order_of_the_common_schedules(name, chunks):
    from testbed.train.nccl import order_problems
    for pp in (2, 4):
        assert order_problems(lower(generate(name, pp, 2 * pp, chunks)), pp) == []


def test_a_schedule_whose_receives_are_posted_out_of_order_is_named():
    from testbed.train.nccl import order_problems
    # zbv on 2 ranks sends the third activation before a gradient it receives first
    problems = order_problems(lower(generate("zbv", 2, 4, 2)), 2)
    assert problems and "pipeline rank 0 → 1: transfer 2" in problems[0], problems
    # and a 1f1b whose receiver posts two receives the other way round
    s = lower(generate("1f1b", 2, 4, 1))
    recvs = [i for i, a in enumerate(s.actions[1]) if a.kind is Kind.RECV_F]
    a, b = recvs[0], recvs[1]
    s.actions[1][a], s.actions[1][b] = s.actions[1][b], s.actions[1][a]
    assert order_problems(s, 2), "a swapped receive order went unnoticed"


def test_what_nccl_does_not_run_yet_is_refused_when_the_file_is_read():
    for extra, what in [({"parallel": Parallel(pp=2, dp=2)}, "dp > 1"),
                        ({"executor": "torch"}, "executor: torch"),
                        ({"connections": 4}, "connections > 1")]:
        with pytest.raises(pydantic.ValidationError, match=what):
            Workload(dist_backend="nccl", **{"parallel": Parallel(pp=2), **extra})
    Workload(dist_backend="gloo", parallel=Parallel(pp=2, dp=2))  # gloo runs them all


def test_validate_exits_2_for_nccl_with_data_parallelism(tmp_path):
    exp = tmp_path / "bad.yaml"
    text = (ROOT / "experiments" / "gpu-nccl.yaml").read_text()
    exp.write_text(text.replace("parallel: {pp: 2, dp: 1}", "parallel: {pp: 2, dp: 2}"))
    res = subprocess.run([sys.executable, "-m", "testbed", "validate", str(exp)], cwd=ROOT,
                         capture_output=True, text=True)
    assert res.returncode == 2, res
    assert "dist_backend: nccl does not run with dp > 1" in res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr


@no_cuda
@pytest.mark.torch
def test_a_nccl_cell_without_cuda_fails_in_one_line(tmp_path):
    w = Workload(model=ModelSpec(layers=2, hidden=32, heads=2, seq_len=16, vocab=64),
                 parallel=Parallel(pp=2), microbatches=2, iterations=2, warmup=1,
                 compute=Compute(forward_ms=1, backward_ms=2), dist_backend="nccl")
    with pytest.raises(WorkerError, match="dist_backend: nccl but this rank sees no CUDA"):
        run_local(w, tmp_path, timeout_s=60)
