"""Self-fidelity: how far the instrument distorted its own measurement of a cell.

Per cell the runner records the signals below and a verdict, ``fidelity`` = ``ok`` or
``degraded: <reason>; <reason>``; the names of the checks behind the reasons are in
``fidelity_failed`` (those of ``MACHINE_CHECKS`` measure this machine, the others the
gap and where the model missed); what could not be checked is listed in
``fidelity_unchecked`` (a traced program has no modelled compute durations, lab hosts' CPUs
are not this box's, a cell without a prediction has no gap to check).

- Emulated compute overshoot: each emulated F/B/I/W records its modelled duration
  (``model_ns``, testbed.traceformat); actual − modelled per action, over the measured
  iterations of every rank: ``compute_overshoot_p50_ms``, ``compute_overshoot_p99_ms`` (raw),
  and ``compute_stretch_pct``: the overshoot beyond the calibrated sleep overshoot the
  simulator already adds to every action (``testbed.sim.calibration``), summed, over the
  summed modelled time.
- Late iteration starts: ``late_starts``, the worker's ``start_sync`` record summed over ranks
  (iterations in which a rank heard of the common start too late).
- CPU: ``cpu_busy_pct``, the whole box's busy share (user, nice, system, irq, softirq, steal)
  over the measured iterations (the workers' whole phase when there are no traces), from
  /proc/stat sampled through the workers' phase (``testbed.readout.cpu.CpuSampler``).
- ``delayline_drops`` and ``queue_drops`` (already in the row).
- Late packet releases: ``delayline_late_releases`` of ``delayline_releases``, the delay
  lines' releases that came more than 1 ms after their packets were due
  (``testbed.net.shaping.delayline.LATE_RELEASE_S``), over the cell (the shaper asks each for
  fresh statistics at the cell's start and end: ``DelayLineShaper.releases``).
- ``predicted_gap_pct``: measured vs predicted iteration time, in %; a gap outside the band
  names the data-parallel all-reduce when its exposed time is off by half the gap or more,
  and so a link direction whose all-reduces ended further apart than predicted (``ringskew``)
  and ring steps inside DCs that took longer than modelled (``hoststeps``).

The column names are owned by ``testbed.readout.columns`` (``FIDELITY``).

Thresholds serve the target "measured within ±5 % of predicted" (``AGREEMENT_PCT``); each
constant says why it has its value; docs/architecture.md ("Fidelity") gives the measurements.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from testbed.cell.celldir import CellDir
from testbed.plan import CellPlan
from testbed.readout import hoststeps, ringskew
from testbed.readout.cpu import CpuSampler
from testbed.readout.traces import load_traces, measured_window
from testbed.readout.tracesignals import Overshoot, compute_overshoot, late_starts

log = logging.getLogger(__name__)

# The target: measured iteration time within ±5 % of the simulator's prediction.
AGREEMENT_PCT = 5.0
# Emulated compute may run this much (%) longer than modelled, beyond the calibrated sleep
# overshoot, before a cell is degraded: compute is at most the whole critical path, so a
# uniform stretch of s % moves the iteration time by at most s %; half the ±5 % budget, the
# other half left for the network emulation and the simulator's own model.
COMPUTE_STRETCH_MAX_PCT = AGREEMENT_PCT / 2
# A program's compute (summed busy time per iteration) may take this much (%) longer in its
# cell than in its control run over loopback before the row is degraded: a program is
# measured against its own control run (within 3 % at no added delay), so a compute stretch
# beyond that is distortion, not the network. A sleep-timed program measured in both agreed
# within 1 % (benchmarks/bench_program.py).
CONTROL_STRETCH_MAX_PCT = 3.0
# One action in a hundred may overshoot (beyond the calibrated overshoot) by less than this
# share of the median iteration time: a larger one on the critical path alone moves its
# iteration by the whole ±5 %, and a cell has hundreds of actions per iteration.
OVERSHOOT_P99_MAX_SHARE = AGREEMENT_PCT / 100
# Iterations that started skewed (summed over ranks, an upper bound on the iterations
# affected) may be at most this share of the iterations run: the p95 column and the median
# tolerate one iteration in twenty off.
LATE_START_MAX_SHARE = 0.05
# Box busy above this (%) over the workers' phase: wake-ups from sleep and the delay line's
# packet releases wait for a CPU. benchmarks/bench_fidelity.py measured the 5 ms sleep's
# overshoot against the box's busy share (output in benchmarks/bench_fidelity.txt).
CPU_BUSY_MAX_PCT = 90.0
# The delay line drops nothing by design (no fail-open, a large queue): any drop is the
# emulator falling behind, and TCP's retransmission then adds time no model predicts.
DELAYLINE_DROPS_MAX = 0
# Delay-line releases more than 1 ms late may be at most this share of their releases: each
# adds 1 ms or more to its packets (5 % of a 20 ms link); one in twenty, as for late starts.
# In a two-DC pipeline cell this machine counted 0-10 of 534-562 idle and 5-7 of 553-584
# beside two CPU hogs (results/benchmarks/slow_day_2026-12-03.md), so a quiet cell stays ok.
LATE_RELEASE_MAX_SHARE = 0.05


# ------------------------------------------------------------------ the verdict
@dataclass
class Signals:
    """What a verdict is made of; None where it was not measured."""

    overshoot: Overshoot | None = None
    late: tuple[int, int] | None = None       # (late starts, iterations run)
    cpu_busy_pct: float | None = None
    delayline_drops: int | None = None
    releases: tuple[int, int] | None = None   # delay-line releases (late, all)
    queue_drops: int | None = None
    measured_s: float | None = None           # median iteration time
    predicted_s: float | None = None
    compute_vs_control_pct: float | None = None  # a program's compute vs its control run
    allreduce_s: tuple[float, float] | None = None  # all-reduce exposed: (measured, predicted)
    ring_skew: ringskew.RingSkew | None = None  # all-reduces ending apart on one link direction
    host_steps_s: float | None = None  # ring steps inside DCs beyond their model, s/iteration
    program: bool = False
    why_unknown: dict[str, str] = field(default_factory=dict)  # check → why it has no input

    @property
    def gap_pct(self) -> float | None:
        if not self.measured_s or not self.predicted_s:
            return None
        return 100.0 * (self.measured_s / self.predicted_s - 1)


# a check's result: a reason the cell is degraded, "" when it passed, None when it had no input
Check = Callable[[Signals], "str | None"]


def _stretch(s: Signals) -> str | None:
    if s.overshoot is None or s.overshoot.stretch_pct is None:
        return None
    st = s.overshoot.stretch_pct
    return f"compute {st:+.1f} % over modelled > {COMPUTE_STRETCH_MAX_PCT} %" \
        if st > COMPUTE_STRETCH_MAX_PCT else ""


def _tail(s: Signals) -> str | None:
    if s.overshoot is None or not s.measured_s:
        return None
    limit_ms = OVERSHOOT_P99_MAX_SHARE * s.measured_s * 1e3
    return (f"overshoot p99 {s.overshoot.p99_ms:.2f} ms > {limit_ms:.2f} ms "
            f"({OVERSHOOT_P99_MAX_SHARE:.0%} of an iteration)") \
        if s.overshoot.p99_excess_ms > limit_ms else ""


def _late(s: Signals) -> str | None:
    if s.late is None:
        return None
    late, iters = s.late
    return f"{late} late starts in {iters} iterations > {LATE_START_MAX_SHARE:.0%}" \
        if iters and late / iters > LATE_START_MAX_SHARE else ""


def _control(s: Signals) -> str | None:
    if s.compute_vs_control_pct is None:
        return None if s.program else ""  # the built-in worker's compute has its model
    st = s.compute_vs_control_pct
    return f"compute {st:+.1f} % over the control run > {CONTROL_STRETCH_MAX_PCT:g} %" \
        if st > CONTROL_STRETCH_MAX_PCT else ""


def _cpu(s: Signals) -> str | None:
    if s.cpu_busy_pct is None:
        return None
    return f"CPU busy {s.cpu_busy_pct:.0f} % > {CPU_BUSY_MAX_PCT:.0f} %" \
        if s.cpu_busy_pct > CPU_BUSY_MAX_PCT else ""


def _delayline(s: Signals) -> str | None:
    if s.delayline_drops is None:
        return ""  # no delay line (netem, lab hosts): nothing of it can drop
    return f"delay line dropped {s.delayline_drops} packets" \
        if s.delayline_drops > DELAYLINE_DROPS_MAX else ""


def _late_releases(s: Signals) -> str | None:
    if s.releases is None:
        return ""  # no delay line (netem, lab hosts): nothing releases late in user space
    late, releases = s.releases
    return f"{late} of {releases} delay-line releases more than 1 ms late > " \
        f"{LATE_RELEASE_MAX_SHARE:.0%}" if releases and late / releases > LATE_RELEASE_MAX_SHARE \
        else ""


def _gap(s: Signals) -> str | None:
    gap = s.gap_pct
    if gap is None:
        return None
    if abs(gap) <= AGREEMENT_PCT:
        return ""
    why = f" with {s.queue_drops} queue drops (loss is not modelled)" if s.queue_drops else ""
    if s.allreduce_s is not None and s.measured_s and s.predicted_s:
        got, want = s.allreduce_s  # where most of the gap is: the all-reduce's exposed time
        if abs(got - want) >= 0.5 * abs(s.measured_s - s.predicted_s):
            why += f", most of it the data-parallel all-reduce (exposed {got:.3f} s, " \
                   f"predicted {want:.3f} s)"
    return f"measured {gap:+.1f} % vs predicted, outside ±{AGREEMENT_PCT:.0f} %{why}"


# the check that is the gap itself (the others, when one flags a missed cell, name a cause)
GAP_CHECK = "measured vs predicted"
# name → check; the name is what ``fidelity_unchecked`` lists when a check had no input
CHECKS: dict[str, Check] = {"compute overshoot": _stretch, "compute overshoot tail": _tail,
                            "late starts": _late, "compute vs control run": _control,
                            "CPU": _cpu, "delay-line drops": _delayline,
                            "delay-line late releases": _late_releases,
                            GAP_CHECK: _gap, "all-reduce sharing": lambda s:
                            ringskew.check(s.ring_skew, s.measured_s, s.predicted_s,
                                           AGREEMENT_PCT),
                            "all-reduce steps inside DCs": lambda s:
                            hoststeps.check(s.host_steps_s, s.measured_s, s.predicted_s,
                                            AGREEMENT_PCT)}
# the checks that measure this machine's distortion of the run (late or stretched compute, busy
# CPUs, the delay line's drops and late releases, slow transfers where no link is emulated), not
# the model's miss: a row outside its band that one of them flagged is no evidence against the model
MACHINE_CHECKS = ("compute overshoot", "compute overshoot tail", "late starts",
                  "compute vs control run", "CPU", "delay-line drops", "delay-line late releases",
                  "all-reduce steps inside DCs")
FAILED_SEPARATOR = "; "  # joins the check names in ``fidelity_failed``


def failed_checks(row: Any) -> list[str]:
    """The check names in ``row``'s ``fidelity_failed`` (none when empty or NaN)."""
    value = row.get("fidelity_failed")
    return [c for c in value.split(FAILED_SEPARATOR) if c] if isinstance(value, str) else []


def verdict(s: Signals) -> tuple[str, dict[str, Any]]:
    """("ok" | "degraded: <reason>; <reason>", the fidelity columns) from ``s``: every check
    of ``CHECKS`` that has its input; the names of those that flagged the cell are in
    ``fidelity_failed`` (in the reasons' order), those without input in
    ``fidelity_unchecked``."""
    reasons, failed, unchecked = [], [], []
    for name, check in CHECKS.items():
        result = check(s)
        if result is None:
            unchecked.append(f"{name} ({s.why_unknown.get(name, 'not measured')})")
        elif result:
            reasons.append(result)
            failed.append(name)
    text = "degraded: " + "; ".join(reasons) if reasons else "ok"
    o, gap = s.overshoot, s.gap_pct
    details = {
        "fidelity": text, "fidelity_failed": FAILED_SEPARATOR.join(failed),
        "fidelity_unchecked": "; ".join(unchecked),
        "compute_overshoot_p50_ms": None if o is None else round(o.p50_ms, 4),
        "compute_overshoot_p99_ms": None if o is None else round(o.p99_ms, 4),
        "compute_stretch_pct": None if o is None or o.stretch_pct is None
        else round(o.stretch_pct, 3),
        "late_starts": None if s.late is None else s.late[0],
        "cpu_busy_pct": None if s.cpu_busy_pct is None else round(s.cpu_busy_pct, 1),
        "predicted_gap_pct": None if gap is None else round(gap, 2),
    }
    return text, details


# ------------------------------------------------------------------ one cell
def assess(cell_dir: Path, plan: CellPlan, row: dict[str, Any],
           cpu: CpuSampler, hosts_here: bool = True) -> dict[str, Any]:
    """The fidelity columns of a finished cell: signals from its traces (when it has any),
    the drops and the measured iteration time in ``row`` (what the cell's run added to its
    row), the predicted one (``row``'s, else the plan's), and the box's CPU busy share over
    the measured iterations (over the workers' whole phase without traces; not used when the
    workers ran elsewhere: ``hosts_here`` False, lab hosts). Raises WorkerError on a broken
    trace."""
    # a cell with steps has its phased prediction in ``row``; the others the plan's
    predicted = row.get("predicted_iteration_time_s",
                        plan.prediction.get("predicted_iteration_time_s"))
    late, releases = row.get("delayline_late_releases"), row.get("delayline_releases")
    s = Signals(delayline_drops=row.get("delayline_drops"), queue_drops=row.get("queue_drops"),
                releases=None if late is None or releases is None else (late, releases),
                measured_s=row.get("iteration_time_s"), predicted_s=predicted,
                compute_vs_control_pct=row.get("compute_vs_control_pct"),
                program=plan.experiment.workload.program is not None)
    pair = (row.get("allreduce_exposed_s"), row.get("predicted_allreduce_exposed_s"))
    s.allreduce_s = pair if all(isinstance(v, (int, float)) and v == v for v in pair) else None
    if s.program and s.compute_vs_control_pct is None:
        s.why_unknown["compute vs control run"] = row.get("control_error") or \
            "no control run (program.control: true) or no compute records"
    # a program stopped at exit after its last iteration has no end record: take it as is
    traces = load_traces(cell_dir, finished=False) if CellDir(cell_dir).traces() else {}
    _trace_signals(s, traces, plan)
    if s.gap_pct is not None and abs(s.gap_pct) > AGREEMENT_PCT:  # only a miss needs a cause
        sim = functools.cache(lambda: ringskew.simulated(plan))  # simulated once, if at all
        s.ring_skew = ringskew.ring_skew(traces, plan, sim)
        # on lab hosts the steps inside DCs cross real machines, not this one's CPUs
        s.host_steps_s = hoststeps.excess(traces, plan, sim) if hosts_here else None
    if not hosts_here:
        s.why_unknown["CPU"] = "the workers ran on lab hosts"
    else:
        window = measured_window(traces)
        s.cpu_busy_pct = cpu.busy_pct_between(*window) if window else cpu.busy_pct
    if s.predicted_s is None:
        s.why_unknown["measured vs predicted"] = "no prediction"
    text, details = verdict(s)
    # the console's warning is on the progress line (testbed.runner.run); run.log gets it here
    log.info("cell %s: fidelity %s", plan.cell.cell_id, text)
    return details


def _trace_signals(s: Signals, traces: dict[int, list[dict]], plan: CellPlan) -> None:
    """Fill the overshoot and late starts of ``s`` from the cell's traces, or say why not."""
    w = plan.experiment.workload
    s.overshoot, s.late = compute_overshoot(traces), late_starts(traces)
    whose = "a program's" if w.program is not None else f"{w.compute.mode} compute's"
    if s.overshoot is None:
        why = f"{whose} actions have no modelled duration" if traces else "no traces"
        s.why_unknown["compute overshoot"] = s.why_unknown["compute overshoot tail"] = why
    if s.late is None:
        s.why_unknown["late starts"] = "no start sync in the traces" if traces else "no traces"
