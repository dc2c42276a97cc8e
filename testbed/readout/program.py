"""A program's measured columns and how they were obtained (``metrics_source``).

- ``instrumented``: a program using torch.distributed.pipelining, traced from outside
  (``testbed.train.instrument``): every metric, from its stages' compute and P2P waits;
- ``marked``: a program calling ``testbed.train.instrument.iteration()``: iteration time and
  throughput only (no compute records, so no bubble);
- ``optimizer``: a program that does neither: its optimizer steps (any ``torch.optim``
  optimizer, seen through torch's global step hook) end its iterations; time and throughput;
- ``regex``: ``program.iteration_regex`` over the first rank whose output matches it:
  iteration time and throughput;
- ``none``: a program with neither: its wall time only, every metric empty (never guessed).

A traced program that calls ``torch.distributed.all_reduce`` also gets its syncs' columns
(``testbed.readout.collectives``).

A program's ranks are not aligned at iteration starts (an ordinary training loop lets a
downstream rank start its next step while upstream ranks still finish theirs), so its
iteration time is the steady-state period (``iteration_basis`` = ``period``, see
``testbed.readout.traces``); the built-in worker's is the span (``worker``, in
``testbed.runner.cell``). Traced programs get the same ``iterations.csv`` as the built-in
worker, a metric they cannot have left empty.

Throughput counts one global batch (microbatches × microbatch_size × dp, × seq_len tokens, as
the workload states them) per median iteration. ``workload.warmup`` iterations are excluded.
"""
from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

from testbed.cell.celldir import CellDir
from testbed.errors import WorkerError
from testbed.net.steps import StepPlayer
from testbed.net.wiresampler import WireSampler
from testbed.plan import CellPlan
from testbed.readout.collectives import program_sync_columns
from testbed.readout.series import FIXED, PERIOD, Series, metrics_and_series
from testbed.readout.traces import iterations_from_optimizer, load_traces, percentile
from testbed.spec import Workload

# what a program row cannot have without compute records
NEEDS_COMPUTE = ("bubble_ratio", "bubble_ratio_max", "bubble_ratio_megatron", "exposed_comm_s")


def program_metrics(cell_dir: Path, plan: CellPlan, player: StepPlayer,
                    finished: bool = True, wire: WireSampler | None = None
                    ) -> tuple[dict[str, Any], Series | None]:
    """(the measured columns of a program's finished cell, with ``metrics_source``; its
    per-iteration series, None where it has no iterations). ``finished`` False takes traces
    of ranks that were stopped at exit as they are. Raises WorkerError when its traces (or
    output, for a regex) hold no measured iteration."""
    d, w = CellDir(Path(cell_dir)), plan.experiment.workload
    traces = load_traces(cell_dir, finished=finished) if d.traces() else {}
    if _has(traces, "iter"):
        return _traced(cell_dir, plan, player, traces, "marked", wire)
    if w.program.iteration_regex:
        return _printed(d, plan)
    if _has(traces, "opt"):
        return _traced(cell_dir, plan, player, iterations_from_optimizer(traces, w.warmup),
                       "optimizer", wire)
    return {"metrics_source": "none"}, None


def _traced(cell_dir: Path, plan: CellPlan, player: StepPlayer, traces: dict[int, list[dict]],
            without_compute: str, wire: WireSampler | None = None
            ) -> tuple[dict[str, Any], Series]:
    """Metrics and series from traces with iteration records: every metric where they have
    compute records (``instrumented``), else iteration time and throughput
    (``without_compute``)."""
    out, series = metrics_and_series(cell_dir, plan, player, PERIOD, traces, wire)
    syncs, calls = program_sync_columns(traces)
    out.update(syncs)
    if calls:  # iterations.csv marks the iterations that all-reduced
        for row in series:
            row["outer_sync"] = calls.get(row["iteration"], "")
    if _has_compute(traces):
        return {**out, "metrics_source": "instrumented"}, series
    return {**{k: v for k, v in out.items() if k not in NEEDS_COMPUTE},
            "metrics_source": without_compute}, series


def _printed(d: CellDir, plan: CellPlan) -> tuple[dict[str, Any], Series]:
    """Metrics and series from the iteration times the program printed
    (``iteration_regex``)."""
    w = plan.experiment.workload
    times = regex_times(d, w.program.iteration_regex, len(plan.slots))[w.warmup:]
    out = iteration_metrics(times, w)
    series = [{**dict.fromkeys(FIXED), "iteration": w.warmup + k, "phase": 0,
               "iteration_time_s": round(t, 6), "step_during": 0}
              for k, t in enumerate(times)]
    return {**out, "iteration_basis": "printed", "metrics_source": "regex"}, series


def _has_compute(traces: dict[int, list[dict]]) -> bool:
    return any(r.get("cat") == "compute" for recs in traces.values() for r in recs)


def _has(traces: dict[int, list[dict]], kind: str) -> bool:
    return any(r.get("type") == kind for recs in traces.values() for r in recs)


def iteration_metrics(seconds: list[float], w: Workload) -> dict[str, Any]:
    """Iteration time (median, p95), throughput and count from measured iteration times (s)."""
    if not seconds:
        raise WorkerError("no measured iteration (iterations ≤ warm-up?)")
    t = statistics.median(seconds)
    samples = w.microbatches * w.microbatch_size * w.parallel.dp
    return {
        "iteration_time_s": round(t, 6),
        "iteration_time_p95_s": round(percentile(seconds, 95), 6),
        "throughput_samples_s": round(samples / t, 4),
        "throughput_tokens_s": round(samples * w.model.seq_len / t, 2),
        "iterations_measured": len(seconds),
    }


def regex_times(cell_dir: CellDir, pattern: str, world_size: int) -> list[float]:
    """Each match's iteration time in seconds (group ``seconds``, or ``ms`` / 1000) in the
    order printed, from the lowest rank whose output matches (programs often print on their
    last rank); [] when none does."""
    for rank in range(world_size):
        times = log_times(Path(cell_dir.worker_log(rank)), pattern)
        if times:
            return times
    return []


def log_times(log: Path, pattern: str) -> list[float]:
    """The iteration times ``pattern`` finds in one rank's output."""
    rx = re.compile(pattern)
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:  # a rank that never started prints nothing
        return []
    except OSError as e:
        raise WorkerError(f"cannot read the program's output {log}: {e.strerror}") from None
    out = []
    for m in rx.finditer(text):
        groups = m.groupdict()
        try:
            out.append(float(groups["seconds"]) if groups.get("seconds") is not None
                       else float(groups["ms"]) / 1000)
        except (TypeError, ValueError):
            raise WorkerError(f"iteration_regex matched {m.group(0)!r}, whose time is not a "
                              "number") from None
    return out
