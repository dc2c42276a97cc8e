"""predict() on experiment files, delays relative to compute ('2xTF'), and the simulate command."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from testbed.__main__ import main
from testbed.errors import SpecError
from testbed.plan import plan_cell, predict as predict_plan
from testbed.sim import SimulationError
from testbed.sim.paths import PathModel
from testbed.spec import PROJECT_ROOT, load_experiment
from testbed.topology import Slot

QUICKSTART = PROJECT_ROOT / "experiments" / "quickstart.yaml"

BASE = """\
name: t
topology:
  name: two
  dcs: [{name: a, hosts: 4}, {name: b, hosts: 4}]
  inter_dc: {rate_mbit: 1000}
links:
  inter_dc: {delay_ms: %(delay)s}
workload:
  model: {layers: 8, hidden: 64, heads: 4, seq_len: 64, vocab: 128}
  parallel: {pp: 4, dp: %(dp)s}
  schedule: %(schedule)s
  microbatches: 8
  compute: %(compute)s
%(matrix)s
"""


def write(tmp_path: Path, delay="0", dp=1, schedule="1f1b", matrix="",
          compute="{forward_ms: 10, backward_ms: 20}") -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(BASE % dict(delay=delay, dp=dp, schedule=schedule, matrix=matrix,
                                compute=compute), encoding="utf-8")
    return path


def test_relative_delays_resolve_to_ms_per_cell(tmp_path):
    matrix = textwrap.dedent("""\
        matrix:
          links.inter_dc.delay_ms: ["0.5xTF", "2xTF", 3]
          workload.compute.forward_ms: [10, 20]
        """)
    le = load_experiment(write(tmp_path, delay='"1xTF"', matrix=matrix))
    got = {(c.params["links.inter_dc.delay_ms"], c.params["workload.compute.forward_ms"]):
           c.experiment.links.inter_dc.delay_ms for c in le.cells}
    assert got == {("0.5xTF", 10): 5.0, ("0.5xTF", 20): 10.0, ("2xTF", 10): 20.0,
                   ("2xTF", 20): 40.0, (3, 10): 3.0, (3, 20): 3.0}
    assert le.experiment.links.inter_dc.delay_ms == 10.0
    link = le.cells[3].experiment.topology.resolved_links(le.cells[3].experiment.links.inter_dc)
    assert link[0].a_to_b.one_way_delay_ms == 40.0


def test_relative_delay_from_device_times_is_the_executors_forward_time(tmp_path):
    from testbed.spec.costs import ComputeTimes

    le = load_experiment(write(tmp_path, delay='"2xTF"',
                               compute="{device: a100, mfu: 0.5}"))
    w = le.experiment.workload
    tf_ms = ComputeTimes.from_workload(w, 0, 4).f * 1000
    assert le.experiment.links.inter_dc.delay_ms == pytest.approx(2 * tf_ms, rel=1e-6)


def test_relative_delay_without_a_forward_time_is_an_error(tmp_path):
    path = write(tmp_path, delay='"2xTF"', compute="{mode: real}")
    with pytest.raises(SpecError, match="needs one stage's forward time"):
        load_experiment(path)


def test_relative_delay_in_a_topology_is_an_error_with_its_position(tmp_path):
    path = write(tmp_path)
    path.write_text(path.read_text().replace("inter_dc: {rate_mbit: 1000}",
                                             "inter_dc: {rate_mbit: 1000, delay_ms: 1xTF}"))
    with pytest.raises(SpecError, match=r"exp.yaml:5:\d+ topology.inter_dc.delay_ms: '1xTF'"):
        load_experiment(path)


def test_a_delay_that_is_neither_ms_nor_relative_is_an_error(tmp_path):
    with pytest.raises(SpecError, match="'3ms' is not a number; write a number such as 1"):
        load_experiment(write(tmp_path, delay='"3ms"'))


def predict(cell, memory_limit=None):
    return predict_plan(plan_cell(cell), memory_limit)


def test_delay_costs_one_f_one_b_more_than_gpipe():
    cells = {(c.params["links.inter_dc.delay_ms"], c.params["workload.schedule"]): c
             for c in load_experiment(QUICKSTART).cells}
    t = {k: predict(c)["predicted_iteration_time_s"] for k, c in cells.items()}
    gpipe, ofob = t[(40, "gpipe")] - t[(0, "gpipe")], t[(40, "1f1b")] - t[(0, "1f1b")]
    assert gpipe == pytest.approx(2 * 0.040 * 1, abs=0.002)  # one DC boundary, fill + drain
    assert ofob > 3 * gpipe


def test_data_parallel_all_reduce_adds_to_the_iteration(tmp_path):
    one = predict(load_experiment(write(tmp_path / "..", dp=1)).cells[0])
    two = predict(load_experiment(write(tmp_path, dp=2)).cells[0])
    assert two["predicted_iteration_time_s"] > one["predicted_iteration_time_s"]


def test_memory_limit_is_checked_not_enforced(tmp_path):
    exp = load_experiment(write(tmp_path, schedule="gpipe")).cells[0]
    assert predict(exp, memory_limit=8)["predicted_memory_ok"] is True
    tight = predict(exp, memory_limit=4)
    assert tight["predicted_memory_ok"] is False and tight["predicted_peak_inflight"] == 8


def test_real_compute_without_times_cannot_be_simulated(tmp_path):
    cell = load_experiment(write(tmp_path, compute="{mode: real}")).cells[0]
    plan = plan_cell(cell)  # placement and schedule need no compute times
    assert plan.prediction == {} and "no modelled compute times" in plan.prediction_note
    with pytest.raises(SimulationError, match="no modelled compute times"):
        predict(cell)


def test_simulate_prints_every_cell(capsys):
    assert main(["simulate", str(QUICKSTART)]) == 0
    out = capsys.readouterr().out
    for c in load_experiment(QUICKSTART).cells:
        assert c.cell_id in out
    assert "iter s" in out and "bubble" in out


def test_simulate_writes_a_timeline(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["simulate", str(QUICKSTART), "--timeline", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["spans"] and max(s["t1"] for s in data["spans"]) == pytest.approx(data["span_s"])
    assert main(["simulate", str(QUICKSTART), "--timeline", str(tmp_path / "t.txt")]) == 2


def test_simulate_reports_bad_input_with_exit_2(tmp_path, capsys):
    assert main(["simulate", str(write(tmp_path, delay='"3ms"'))]) == 2
    assert "exp.yaml:7" in capsys.readouterr().err
    assert main(["simulate", str(QUICKSTART), "--timeline", str(tmp_path / "x.json"),
                 "--cell", "cnope"]) == 2


def test_window_limited_paths_scale_with_connections():
    """0.25 MiB buffers at 40 ms RTT cap one connection near 0.75 × 0.25 MiB per round trip
    (bench_transport's measurement); four connections move four windows; the 1 Gbit/s link
    is the limit once the windows exceed it; paths inside a DC are not capped."""

    le = load_experiment(PROJECT_ROOT / "experiments" / "atlas.yaml")
    rates = {}
    for c in le.cells:
        net = plan_cell(c).paths
        west, east = Slot(0, 0, 0, "west", 0), Slot(1, 1, 0, "east", 0)
        rates[c.params["workload.connections"]] = net.path(west, east).rate_bps
        assert net.path(west, Slot(1, 1, 0, "west", 1)).rate_bps is None
    one = 0.75 * 0.25 * (1 << 20) * 8 / 0.040
    assert rates[1] == pytest.approx(one, rel=0.01)
    assert rates[4] == pytest.approx(4 * one, rel=0.01)
    big = net.topo.model_copy(update={"tcp_buffer_max_mb": 256})
    assert PathModel(big, net.links, 4).path(west, east).rate_bps == 1e9


def test_only_a_shapers_rate_gives_a_burst():
    """The token bucket of the 1 Gbit/s shaper holds two GSO packets (more than 1 ms of its
    rate): a path it limits gets that burst; a path whose rate is a TCP window's cap gets none
    (the bucket refills faster than the window lets bytes out)."""
    cell = load_experiment(PROJECT_ROOT / "experiments" / "atlas.yaml").cells[0]
    net = plan_cell(cell).paths
    west, east = Slot(0, 0, 0, "west", 0), Slot(1, 1, 0, "east", 0)
    assert net.path(west, east).burst_bytes == 0  # 0.25 MiB buffers at 40 ms: window-bound
    big = net.topo.model_copy(update={"tcp_buffer_max_mb": 256})
    shaped = PathModel(big, net.links, 1).path(west, east)
    assert shaped.rate_bps == 1e9 and shaped.burst_bytes == 2 * 65536
    # idle for 0.5 ms: refilled by 0.5 ms of the rate
    assert shaped.burst_at(0.0015, {h: 0.001 for h in shaped.hops}) == pytest.approx(62500)
