"""Discrete-event prediction of a schedule's timeline under per-link latency, bandwidth and an
activation-memory limit (no processes, no sockets, no root, no torch).

``run(inp)`` simulates one iteration of an engine input (``testbed.sim.inputs.build_input``,
which ``testbed.plan`` calls with a cell's plan); ``predicted(res)`` gives ``predicted_*``
values with the definitions of ``testbed.readout.traces`` (bubble = idle / span per rank, mean
and max over ranks; exposed communication = time blocked on receives and on the final send
wait, mean over ranks), so that they sit beside the measured columns. The model is in
``testbed.sim.engine``; the fixed software costs it adds, measured here, in
``testbed.sim.calibration``.
"""
from __future__ import annotations

from typing import Any

from testbed.errors import EXIT_BAD_INPUT, TestbedError
from testbed.sim.collective import predicted_allreduce
from testbed.sim.engine import simulate
from testbed.sim.iteration import Deadlock, SimInput, SimResult


class SimulationError(TestbedError):
    """The cell cannot be simulated (unknown compute times, a deadlocked order); exit 2."""

    exit_code = EXIT_BAD_INPUT


def run(inp: SimInput) -> SimResult:
    """Simulate one iteration; raises SimulationError when the order deadlocks."""
    try:
        return simulate(inp)
    except Deadlock as e:
        raise SimulationError(f"{inp.schedule.name}: {e}") from None


def predicted(res: SimResult, memory_limit: int | None = None) -> dict[str, Any]:
    """Predicted metrics of one simulated iteration, keyed like the results CSV
    (``predicted_…``).

    ``memory_limit`` (microbatches of activations a virtual stage may hold) is checked, not
    enforced: the schedule's order is fixed, so ``predicted_memory_ok`` says whether the
    schedule stays within it.
    """
    out = {f"predicted_{k}": round(v, 6) for k, v in res.metrics().items()}
    out["predicted_peak_inflight"] = max(res.peak_inflight_per_stage)
    out["predicted_peak_inflight_per_stage"] = list(res.peak_inflight_per_stage)
    out.update(predicted_allreduce(res))
    if memory_limit is not None:
        out["predicted_memory_ok"] = out["predicted_peak_inflight"] <= memory_limit
    return out
