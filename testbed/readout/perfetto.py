"""Export a cell's traces as a Chrome trace-event file (opens in ui.perfetto.dev).

One process per run, one thread (track) per rank; F, B, I, W, communication, waits and filler
requests (inside the waits they filled) each get their own colour. Times are microseconds from
the earliest record.
"""
from __future__ import annotations

import json
from pathlib import Path

from testbed.traceformat import TRACE_GLOB, read_trace

# Chrome's reserved colour names (catapult's colour scheme)
COLOURS = {"F": "thread_state_running", "B": "thread_state_iowait", "I": "rail_response",
           "W": "rail_animation", "wait": "terrible", "comm": "good", "OPT": "grey",
           "ALLREDUCE": "yellow", "fill": "olive"}


def _colour(rec: dict) -> str:
    if rec["cat"] == "compute":
        return COLOURS.get(rec["kind"], "generic_work")
    return COLOURS.get(rec["kind"], COLOURS[rec["cat"]])


def _name(rec: dict) -> str:
    stage = "" if rec.get("stage") is None else str(rec["stage"])
    mb = "" if rec.get("mb") is None else str(rec["mb"])
    return f"{stage}{rec['kind']}{mb}"


def events(cell_dir: Path) -> list[dict]:
    """Trace events for every rank's actions and iterations."""
    recs = {}
    for path in sorted(Path(cell_dir).glob(TRACE_GLOB)):
        rows = list(read_trace(path))
        meta = next((r for r in rows if r.get("type") == "meta"), None)
        if meta:
            recs[meta["rank"]] = rows
    starts = [r["t0"] for rows in recs.values() for r in rows if "t0" in r]
    if not starts:
        return []
    base = min(starts)
    out: list[dict] = []
    for rank, rows in sorted(recs.items()):
        out.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": rank,
                    "args": {"name": f"rank {rank}"}})
        for r in rows:
            if r.get("type") == "action":
                out.append({"ph": "X", "name": _name(r), "cat": r["cat"], "pid": 0, "tid": rank,
                            "ts": (r["t0"] - base) / 1e3, "dur": (r["t1"] - r["t0"]) / 1e3,
                            "cname": _colour(r),
                            "args": {"iter": r["iter"], "bytes": r.get("bytes", 0),
                                     "peer": r.get("peer")}})
            elif r.get("type") == "fill":  # nested inside the wait it filled
                out.append({"ph": "X", "name": f"fill ×{r['requests']}", "cat": "fill", "pid": 0,
                            "tid": rank, "ts": (r["t0"] - base) / 1e3,
                            "dur": (r["t1"] - r["t0"]) / 1e3, "cname": COLOURS["fill"],
                            "args": {"iter": r["iter"], "at": _name(dict(r, kind=r["at"])),
                                     "tokens": r["tokens"]}})
            elif r.get("type") == "iter":
                out.append({"ph": "X", "name": f"iteration {r['iter']}" +
                            (" (warm-up)" if r["warmup"] else ""), "cat": "iteration", "pid": 1,
                            "tid": rank, "ts": (r["t0"] - base) / 1e3,
                            "dur": (r["t1"] - r["t0"]) / 1e3, "args": {"loss": r.get("loss")}})
    out.append({"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "actions"}})
    out.append({"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "iterations"}})
    return out


def export(cell_dir: Path) -> Path:
    """Write ``cell_dir/trace.json`` and return its path."""
    path = Path(cell_dir) / "trace.json"
    path.write_text(json.dumps({"traceEvents": events(cell_dir), "displayTimeUnit": "ms"}),
                    encoding="utf-8")
    return path
