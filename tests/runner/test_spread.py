"""Spread and the summary's derived tables, on hand-made data: the median's interval, the axes
(planned settings included), the delay-induced bubble, and the wall-time throughput."""
from __future__ import annotations

import pandas as pd
import pytest

from testbed.readout.traces import summarize, wall_time_per_iteration
from testbed.report.sections import delay_bubble_table
from testbed.report.spread import median_ci
from testbed.report.tables import axes
from testbed.spec.workload import Workload


def test_median_interval_is_the_order_statistic_interval():
    values = list(range(1, 31))[::-1]  # 30 values, unsorted
    m, lo, hi = median_ci(values)
    # n = 30: the 95 % interval of the median is [x_(10), x_(21)] (coverage 95.7 %)
    assert (m, lo, hi) == (15.5, 10, 21)
    assert median_ci([1, 2, 3, 4, 5, 6]) == (3.5, 1, 6)  # n = 6: the range covers 96.9 %
    assert median_ci([1, 2, 3, 4, 5])[1:] == (None, None)  # n = 5: 93.8 % at best


def test_planned_settings_that_vary_are_axes_unless_a_swept_parameter_names_them():
    df = pd.DataFrame({"experiment": ["e"] * 2, "cell_id": ["a", "b"],
                       "workload.parallel.pp": [6, 6], "placement": ["in_order", "cba"],
                       "placement_stage_dcs": ["x y", "y x"], "pp": [6, 6],
                       "schedule": ["1f1b", "1f1b"]})
    assert axes(df) == ["workload.parallel.pp", "placement", "placement_stage_dcs"]


def test_delay_induced_bubble_and_its_cut_against_1f1b():
    # the figures: 1F1B 0.350 at zero delay and 0.545 at 2xTF, geopipe 0.380
    d, s, mem = "links.inter_dc.delay_ms", "workload.schedule", "workload.memory_limit"
    cells = pd.DataFrame({"cell_id": list("abcd"), d: ["0", "0", "2xTF", "2xTF"],
                          s: ["1f1b", "geopipe", "1f1b", "geopipe"], mem: [4, 6, 4, 6],
                          "bubble_ratio": [0.350, 0.350, 0.545, 0.380]})
    t = delay_bubble_table(cells, [d, s, mem]).set_index("cell_id")
    assert list(t.index) == ["c", "d"]
    assert t.loc["c", "delay-induced bubble"] == pytest.approx(0.195)
    assert t.loc["d", "induced-bubble cut vs 1f1b"] == pytest.approx(1 - 0.030 / 0.195)
    assert t.loc["d", "total-bubble cut vs 1f1b"] == pytest.approx(1 - 0.380 / 0.545)
    assert delay_bubble_table(cells[cells[d] != "0"], [d, s, mem]) is None


def _iteration(it: int, t0_s: float, span_s: float) -> dict:
    return {"iter": it, "span_s": span_s, "t0_ns": int(t0_s * 1e9),
            "t1_ns": int((t0_s + span_s) * 1e9), "busy_s": {0: span_s / 2, 1: span_s / 2},
            "wait_s": {0: 0.0, 1: 0.0}}


def test_throughput_counts_the_gaps_between_iterations():
    w = Workload.model_validate({"model": {"layers": 2, "hidden": 64, "heads": 4,
                                           "seq_len": 32, "vocab": 128},
                                 "parallel": {"pp": 2, "dp": 1}, "microbatches": 4,
                                 "compute": {"mode": "emulated", "forward_ms": 5,
                                             "backward_ms": 10}})
    # spans of 1 s, each followed by a 0.25 s gap (barrier and start sync)
    iters = [_iteration(k, 1.25 * k, 1.0) for k in range(1, 5)]
    assert wall_time_per_iteration(iters) == pytest.approx(1.25)
    m = summarize(iters, w)
    assert m["iteration_throughput_samples_s"] == pytest.approx(4.0)
    assert m["throughput_samples_s"] == pytest.approx(4 / 1.25)
