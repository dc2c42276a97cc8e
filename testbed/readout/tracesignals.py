"""The fidelity signals read from a cell's traces: emulated compute's overshoot against its
modelled durations, and the iterations a rank started late (``testbed.readout.fidelity`` turns
them into its verdict)."""
from __future__ import annotations

from dataclasses import dataclass

from testbed.readout.traces import percentile
from testbed.sim.calibration import SLEEP_OVERSHOOT_S


@dataclass
class Overshoot:
    """Emulated compute overshoot over the measured iterations: raw p50 and p99 (ms), the
    stretch beyond the calibrated sleep overshoot (% of the modelled time) and p99's excess
    over that calibration (ms)."""

    p50_ms: float
    p99_ms: float
    stretch_pct: float | None
    actions: int

    @property
    def p99_excess_ms(self) -> float:
        return self.p99_ms - SLEEP_OVERSHOOT_S * 1e3


def compute_overshoot(traces: dict[int, list[dict]]) -> Overshoot | None:
    """Actual − modelled duration of every emulated compute action (records with
    ``model_ns``) in the measured (not warm-up) iterations; None when there is none."""
    warm = {r["iter"] for recs in traces.values() for r in recs
            if r.get("type") == "iter" and r.get("warmup")}
    over: list[int] = []
    modelled = 0
    for recs in traces.values():
        for r in recs:
            if r.get("type") == "action" and "model_ns" in r and r["iter"] not in warm:
                over.append(r["t1"] - r["t0"] - r["model_ns"])
                modelled += r["model_ns"]
    if not over:
        return None
    excess_ns = sum(over) - len(over) * SLEEP_OVERSHOOT_S * 1e9
    return Overshoot(percentile(over, 50) / 1e6, percentile(over, 99) / 1e6,
                     100 * excess_ns / modelled if modelled else None, len(over))


def late_starts(traces: dict[int, list[dict]]) -> tuple[int, int] | None:
    """(late starts summed over ranks, measured iterations) from the workers' ``start_sync``
    and ``iter`` records (warm-up iterations count in neither); None when no rank has a
    ``start_sync`` record (a program)."""
    syncs = [r for recs in traces.values() for r in recs if r.get("type") == "start_sync"]
    if not syncs:
        return None
    iters = max(sum(1 for r in recs if r.get("type") == "iter" and not r.get("warmup"))
                for recs in traces.values())
    return sum(int(r.get("late_starts", 0)) for r in syncs), iters
