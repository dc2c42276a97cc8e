"""A cell's measured columns and how they were obtained (``metrics_source``).

- ``worker``: the built-in worker's traces (every metric);
- ``instrumented``: a program using torch.distributed.pipelining, traced from outside
  (``testbed.train.instrument``): every metric, from its stages' compute and P2P waits;
- ``marked``: a program calling ``testbed.train.instrument.iteration()``: iteration time and
  throughput only (no compute records, so no bubble);
- ``regex``: ``program.iteration_regex`` over rank 0's output: iteration time and throughput;
- ``none``: a program with neither: its wall time only, every metric empty (never guessed).

Throughput counts one global batch (microbatches × microbatch_size × dp, × seq_len tokens, as
the workload states them) per median iteration. ``workload.warmup`` iterations are excluded.
"""
from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

from testbed.errors import WorkerError
from testbed.launch.celldir import CellDir
from testbed.metrics import load_traces, percentile, per_iteration, summarize
from testbed.spec import Workload


def cell_metrics(cell_dir: Path, w: Workload) -> dict[str, Any]:
    """The measured columns of a finished cell, with ``metrics_source``; raises WorkerError
    when its traces (or rank 0's output, for a regex) hold no measured iteration."""
    d = CellDir(Path(cell_dir))
    if w.program is None:
        return {**summarize(per_iteration(load_traces(cell_dir)), w), "metrics_source": "worker"}
    if d.traces():
        traces = load_traces(cell_dir)
        iters = per_iteration(traces)
        if any(r.get("cat") == "compute" for recs in traces.values() for r in recs):
            return {**summarize(iters, w), "metrics_source": "instrumented"}
        return {**iteration_metrics([i["span_s"] for i in iters], w), "metrics_source": "marked"}
    if w.program.iteration_regex:
        times = regex_times(Path(d.worker_log(0)), w.program.iteration_regex)[w.warmup:]
        return {**iteration_metrics(times, w), "metrics_source": "regex"}
    return {"metrics_source": "none"}


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


def regex_times(log: Path, pattern: str) -> list[float]:
    """Each match's iteration time in seconds (group ``seconds``, or ``ms`` / 1000) in the
    order they were printed."""
    rx = re.compile(pattern)
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise WorkerError(f"cannot read rank 0's output {log}: {e.strerror}") from None
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
