"""Time-varying steps timed by iteration: the model accepts exactly one clock per step and one
per link, and the runner's watch of rank 0's trace counts finished iterations as the trace
grows (partial lines included)."""
from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from testbed.runner.tracewatch import IterationWatch
from testbed.topology import InterDCLink, Step


def test_a_step_gives_exactly_one_of_at_s_and_at_iteration():
    assert Step(at_iteration=3, delay_ms=40).at_s is None
    for bad in ({"delay_ms": 40}, {"at_s": 1, "at_iteration": 3, "delay_ms": 40}):
        with pytest.raises(ValidationError, match="at_s or at_iteration"):
            Step(**bad)


def test_a_links_steps_do_not_mix_clocks():
    with pytest.raises(ValidationError, match="mixed"):
        InterDCLink(dcs=("a", "b"), steps=[{"at_s": 1, "delay_ms": 5},
                                           {"at_iteration": 2, "delay_ms": 9}])


def test_the_watch_counts_iterations_as_the_trace_grows(tmp_path):
    trace = tmp_path / "trace-rank0.jsonl"
    watch = IterationWatch(trace)
    assert watch.done() == 0  # no file yet
    rec = lambda it: json.dumps({"type": "iter", "iter": it, "warmup": False, "t0": 1, "t1": 2},
                                separators=(",", ":"))  # noqa: E731 (as the worker writes)
    action = json.dumps({"iter": 0, "kind": "F", "type": "action"}, separators=(",", ":"))
    with open(trace, "w") as f:
        f.write(action + "\n" + rec(0) + "\n" + rec(1)[:10])  # iteration 1 half written
        f.flush()
        assert watch.done() == 1
        f.write(rec(1)[10:] + "\n")
        f.flush()
        assert watch.done() == 2
