"""A real run's row against its prediction: within the test's band, or a row whose own
fidelity verdict names what on this machine distorted the run.

testbed promises a measurement within its band of the prediction, or a row that says why not
(``testbed.readout.fidelity``). On a shared 2-core machine whose timed wake-ups come late (on
some hours by many milliseconds, sleeps and delay-line releases alike:
results/suite/xdist-timing.md, results/benchmarks/slow_day_2026-12-03.md) the first half cannot
always hold; the second always must. So a row outside its band passes only when its verdict is
degraded for a cause measured on this machine (emulated compute over its model, its tail, late
starts, busy CPUs, the delay line dropping, slow ring steps inside DCs), and the test then
warns that the prediction went unjudged on that run. A row outside the band that calls itself
ok, or whose verdict names only the gap or where the model missed, fails. Which checks measure
the machine is fidelity's to say (``MACHINE_CHECKS``, read from the row's ``fidelity_failed``),
not the reasons' wording."""
from __future__ import annotations

import warnings
from typing import Any, Mapping

from testbed.readout.fidelity import MACHINE_CHECKS, failed_checks

SHOWN = ("iteration_time_s", "predicted_iteration_time_s", "mean_iteration_time_s",
         "predicted_mean_iteration_time_s", "compute_stretch_pct", "compute_overshoot_p99_ms",
         "late_starts", "cpu_busy_pct", "delayline_drops")


class PredictionNotJudged(UserWarning):
    """The row missed its band and its verdict blamed the machine: nothing judged this time."""


def machine_causes(row: Mapping[str, Any]) -> list[str]:
    """The checks of ``row``'s fidelity verdict (its ``fidelity_failed``) that flagged this
    machine's distortion of the run (``MACHINE_CHECKS``), not the gap or the model's miss."""
    if not str(row.get("fidelity")).startswith("degraded"):
        return []
    return [name for name in failed_checks(row) if name in MACHINE_CHECKS]


def check_prediction(row: Mapping[str, Any], within: bool, what: str = "the row") -> None:
    """Pass when ``within`` (the test's own band held); else demand that ``row``'s fidelity
    verdict names a cause on this machine, and warn that the prediction went unjudged."""
    if within:
        return
    causes = machine_causes(row)
    shown = {k: row[k] for k in SHOWN if k in row}
    assert causes, (f"{what} is outside its band of the prediction and its verdict names no "
                    f"cause on this machine: {row.get('fidelity')!r}; {shown}")
    warnings.warn(PredictionNotJudged(f"{what}: prediction not judged on this run, the "
                                      f"machine distorted it: {'; '.join(causes)}: "
                                      f"{row.get('fidelity')}; {shown}"))
