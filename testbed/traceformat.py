"""The per-rank trace format: one JSON object per line, written by workers, read by metrics.

Times are integers in nanoseconds of ``time.monotonic_ns()`` on the rank's own clock (all
namespaces of one machine share CLOCK_MONOTONIC; across hosts the runner records offsets).

Record types (field ``type``):

- ``meta`` (first line): rank, world_size, pp_rank, dp_rank, stages (virtual stages owned),
  schedule, executor ("ir" | "torch"), compute_mode ("real" | "emulated"), microbatches,
  microbatch_size, seq_len, connections (TCP connections per transfer), host, local_rank and
  local_world_size (the rank's place among its host's ranks), cuda_visible_devices (its GPU,
  null when none was given), torch_version, clock ("monotonic"), pid and ppid (the rank's
  process and its parent), started and joined (monotonic ns: the worker's start and the end of
  its process-group rendezvous), dist_backend ("gloo" | "nccl") and device ("cpu", "cuda:N").
- ``readback`` (NCCL, and gloo under TESTBED_ORDERED_TRANSPORT; on the sending rank of each
  DC boundary, before the first iteration): peer, bytes (one activation), seconds (its one-way
  time, median of the rounds), rounds, round_trips (each round's [activation out and one
  element back, one element each way], seconds), backend (``testbed.train.nccl.read_back``).
- ``start_sync`` (last before ``end``): margin_ms (how far ahead of the last rank's arrival
  each iteration's common start was set, at first), final_margin_ms (the same at the end: it
  widens after late starts, see testbed.train.sync), late_starts (measured iterations this
  rank heard of it too late; warm-up iterations are not counted).
- ``iter``: iter (0-based), warmup (bool), t0, t1 (iteration start/end on this rank), loss
  (float or null; real compute on the last stage only).
- ``action``: iter, kind (F/B/I/W/SEND_F/RECV_F/SEND_B/RECV_B/ALLREDUCE/ALLREDUCE_STEP/OPT;
  waits are RECV_F/RECV_B/SEND_WAIT/ALLREDUCE_WAIT/P2P_WAIT), stage, mb (microbatch or null),
  t0, t1, cat ("compute" | "comm" | "wait"), bytes (payload bytes, 0 for compute), peer
  (global rank or null). For compute, t0..t1 is pure compute; a ``wait`` record is time
  blocked on communication (e.g. waiting for an activation to arrive). Emulated compute
  records (F/B/I/W) also have model_ns: the modelled duration the action was meant to take
  (its sleep), so (t1 − t0) − model_ns is the action's overshoot (``testbed.readout.fidelity``);
  real compute and a traced program's compute have no model_ns.
  ``ALLREDUCE_STEP`` (emulated compute with dp > 1, ``testbed/train/ring.py``): one step of the
  ring all-reduce, recorded from the thread that drives it, so it overlaps the rank's other
  records; ``mb`` is the step (0 … 2(dp−1)−1), bytes the chunk sent, peer the next rank.
- ``fill`` (only with ``workload.filler``): iter, at (the wait it filled: RECV_F/RECV_B/
  SEND_WAIT/ALLREDUCE_WAIT, or TAIL for the barrier after the iteration), stage, mb, t0, t1
  (the run of filler requests), requests, tokens, arrived (when the awaited transfer completed;
  training resumed at max(t1, arrived)). The ``wait`` record around it still spans the whole
  time the rank did no training work.
- ``opt`` (a traced program, ``testbed.train.instrument``): t (an optimizer step's end), opt
  (which optimizer: 0 for the first to step, 1 for the next, …).
- ``collective`` (a traced program): op ("all_reduce"), t0, t1 (the call), bytes (the
  tensor's), blocking (false for ``async_op=True``, whose call returns at once); or op
  "wait": the ``wait()`` of an async all-reduce's work, t0, t1, bytes 0, blocking true.
- ``end``: status ("ok" | "error"), error (message or null), t (ns).

Metrics only trust ``compute`` records as busy time; everything else in an iteration span is idle.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

TRACE_GLOB = "trace-rank*.jsonl"


def trace_path(directory: Path, rank: int) -> Path:
    """Where rank ``rank``'s trace lives inside a cell directory."""
    return Path(directory) / f"trace-rank{rank}.jsonl"


def read_trace(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the records of one trace file; a torn last line (crash mid-write) is skipped."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                if f.read(1) == "":  # only the last line may be torn
                    return
                raise
