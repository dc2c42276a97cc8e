"""Writing a rank's trace (format: ``testbed.traceformat``), buffered per iteration."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


# model_ns last: only emulated compute has it (the tuple is one shorter otherwise, and zip()
# leaves the field out of the record)
ACTION_FIELDS = ("iter", "kind", "stage", "mb", "t0", "t1", "cat", "bytes", "peer", "model_ns")


class Tracer:
    """Appends records to ``trace-rank<r>.jsonl``; ``flush`` at the end of each iteration so a
    crash loses at most the iteration in progress. ``actions=False`` keeps only iteration
    records (the worker toggles it to measure the tracing overhead)."""

    def __init__(self, path: Path, actions: bool = True):
        self.path = Path(path)
        self.actions = actions
        self._f = open(self.path, "w", encoding="utf-8")
        self._buf: list[Any] = []

    def record(self, **fields: Any) -> None:
        self._buf.append(fields)

    def action(self, it: int, kind: str, stage: int | None, mb: int | None, t0: int, t1: int,
               cat: str, nbytes: int = 0, peer: int | None = None,
               model_ns: int | None = None) -> None:
        """One action record; times in ns. ``model_ns`` is the modelled duration of an
        emulated compute action (what it was meant to take: t1 − t0 − model_ns is its
        overshoot); None elsewhere, and then the record has no such field."""
        if self.actions:  # a tuple now, JSON at flush: keeps encoding off the timed path
            rec = (it, kind, stage, mb, t0, t1, cat, nbytes, peer)
            self._buf.append(rec if model_ns is None else rec + (model_ns,))

    def fill(self, it: int, point: tuple, t0: int, t1: int, requests: int, tokens: int,
             arrived: int) -> None:
        """A run of filler requests inside the idle gap at wait ``point`` (kind, stage, mb);
        ``arrived`` is when the awaited transfer completed (ns)."""
        if self.actions:
            kind, stage, mb = point
            self._buf.append(dict(type="fill", iter=it, at=kind, stage=stage, mb=mb, t0=t0,
                                  t1=t1, requests=requests, tokens=tokens, arrived=arrived))

    def flush(self) -> None:
        """Encode and write what was recorded (called between iterations, outside the
        timed part)."""
        if self._buf:
            self._f.write("\n".join(json.dumps(r if isinstance(r, dict) else dict(
                zip(ACTION_FIELDS, r), type="action"), separators=(",", ":"))
                for r in self._buf) + "\n")
            self._buf.clear()
        self._f.flush()

    def end(self, status: str, error: str | None, t: int | None = None) -> None:
        """The last record; ``t`` is when the failure happened (default: now)."""
        self.record(type="end", status=status, error=error,
                    t=time.monotonic_ns() if t is None else t)
        self.flush()
        self._f.close()
