"""A sweep's program interpreters (testbed.launch.interpreters), for real: one per start-up
environment; one that still serves a rank of the cell is never ended for another, one that
serves none ends when a new one is needed."""
from __future__ import annotations

import sys
import time

import pytest

from testbed.launch.interpreters import Interpreters, startup_env, uses_torch_executor
from testbed.launch.pool import ZYGOTE_MODULE
from testbed.spec.workload import Workload
from testbed.train.zygote import TORCH_EXECUTOR

pytestmark = [pytest.mark.torch]
SMALL = {"model": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 128},
         "parallel": {"pp": 2, "dp": 1}, "microbatches": 2,
         "compute": {"mode": "emulated", "forward_ms": 1, "backward_ms": 1}}


def test_only_variables_read_at_start_up_choose_the_interpreter():
    env = {"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
           "RANK": "3", "TORCHELASTIC_RUN_ID": "c1", "CUDA_VISIBLE_DEVICES": "0", "MY_FLAG": "x"}
    assert startup_env(env) == {"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1",
                                "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def test_an_interpreter_serving_the_cell_outlives_a_second_one_and_ends_after_it():
    with Interpreters(sys.executable) as interpreters:
        interpreters.begin_cell()
        first = interpreters.for_program({"PYTHONHASHSEED": "0", "RANK": "0"})
        assert interpreters.for_program({"PYTHONHASHSEED": "0", "RANK": "1"}) is first
        first.warm()
        second = interpreters.for_program({"PYTHONHASHSEED": "1", "RANK": "2"})
        assert second is not first
        second.warm()
        assert first.proc is not None and first.proc.poll() is None  # still serves rank 0
        interpreters.begin_cell()
        third = interpreters.for_program({"PYTHONHASHSEED": "2", "RANK": "0"})
        assert first.proc is None and second.proc is None  # served no rank of this cell
        assert third is not first and third is not second


def _zygote_argv(interpreters: Interpreters) -> list[str]:
    """The command line of the worker's interpreter, once it has exec'd (until then its
    ``/proc`` entry shows the forking process's, or nothing)."""
    interpreters.worker.warm()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(f"/proc/{interpreters.worker.proc.pid}/cmdline", "rb") as f:
            argv = f.read().decode().split("\0")
        if ZYGOTE_MODULE in argv:
            return argv
        time.sleep(0.01)
    raise AssertionError(f"the zygote's command line is still {argv}")


def test_the_worker_interpreter_imports_torchs_pipelining_only_for_the_torch_executor():
    """A sweep of ``executor: ir`` cells (the default) has no use for torch's schedules, whose
    import (``torch.distributed.pipelining``, with dynamo and DTensor) took every sweep's
    worker interpreter a median 2.24 s of CPU at its start, 1.27 s without
    (results/leads/worker-imports/startcpu.md)."""
    ir, torch_executor = (Workload.model_validate({**SMALL, "executor": e}) for e in ("ir", "torch"))
    program = Workload.model_validate({**SMALL, "executor": "torch",
                                       "program": {"argv": ["python", "x.py"]}})
    assert not uses_torch_executor([ir, ir])
    assert not uses_torch_executor([program])  # a program's ranks are not the built-in worker
    assert uses_torch_executor([ir, torch_executor])
    with Interpreters(sys.executable) as interpreters:
        assert TORCH_EXECUTOR not in _zygote_argv(interpreters)
    with Interpreters(sys.executable, torch_executor=True) as interpreters:
        assert TORCH_EXECUTOR in _zygote_argv(interpreters)
