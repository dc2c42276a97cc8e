"""A sweep's program interpreters (testbed.launch.interpreters), for real: one per start-up
environment; one that still serves a rank of the cell is never ended for another, one that
serves none ends when a new one is needed."""
from __future__ import annotations

import sys

import pytest

from testbed.launch.interpreters import Interpreters, startup_env

pytestmark = [pytest.mark.torch]


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
