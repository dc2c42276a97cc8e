"""Cell plans: placement strategies on experiment files, cross-DC schedules built from the
cell's links, and the worker's use of the planned schedule. No root, no processes."""
from __future__ import annotations

import textwrap

import pytest

from testbed.plan import crossdc_context, plan_cell, predict
from testbed.spec import PROJECT_ROOT, load_experiment


def _load(tmp_path, body: str):
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return load_experiment(path)


UNEQUAL = f"""\
name: t
topology: {PROJECT_ROOT}/topologies/three-dc-unequal.yaml
workload:
  model: {{layers: 24, hidden: 1024, heads: 16, seq_len: 1024, vocab: 32000}}
  parallel: {{pp: 6, dp: 1}}
  microbatches: 16
  compute: {{forward_ms: 20, backward_ms: 40, bytes_scale: 0.25}}
matrix:
  placement: [in_order, atlas, cba]
"""


def test_cba_beats_in_order_on_the_unequal_three_dc_topology_in_simulation(tmp_path):
    plans = {c.params["placement"]: plan_cell(c) for c in _load(tmp_path, UNEQUAL).cells}
    dcs = {k: p.stage_dcs for k, p in plans.items()}
    assert dcs["in_order"] == ["east", "east", "mid", "mid", "west", "west"]
    assert "mid" not in dcs["cba"] and "mid" not in dcs["atlas"]
    t = {k: p.prediction["predicted_iteration_time_s"] for k, p in plans.items()}
    assert t["cba"] <= 0.8 * t["in_order"], t


CROSS = f"""\
name: t
topology: {PROJECT_ROOT}/topologies/two-dc.yaml
links:
  inter_dc: {{delay_ms: 2xTF, rate_mbit: 1000}}
workload:
  model: {{layers: 8, hidden: 1024, heads: 16, seq_len: 1024, vocab: 32000}}
  parallel: {{pp: 4, dp: 1}}
  microbatches: 8
  memory_limit: 4
  compute: {{forward_ms: 20, backward_ms: 40, bytes_scale: 0.25}}
matrix:
  workload.schedule: [1f1b, geopipe, crosspipe_greedy, crosspipe_milp]
"""


def test_cross_dc_context_comes_from_the_placements_boundary(tmp_path):
    plan = plan_cell(_load(tmp_path, CROSS).cells[1])
    ctx = crossdc_context(plan.experiment, plan.paths, plan.costs, plan.slots)
    assert (ctx.f_ms, ctx.b_ms, ctx.memory_limit) == (20, 40, 4)
    # stage 1 → 2 crosses the 40 ms (2 × TF) link; 1 MiB at 1 Gbit/s ≈ 8.8 ms on the wire
    assert ctx.boundaries[1].delay_ms == pytest.approx(40, abs=0.5)
    assert 8 < ctx.boundaries[1].serialization_ms < 10
    assert ctx.boundaries[0].delay_ms < 1 and ctx.boundaries[2].delay_ms < 1


def test_cross_dc_schedules_are_planned_and_predicted_within_the_memory_limit(tmp_path):
    got = {}
    for c in _load(tmp_path, CROSS).cells:
        plan = plan_cell(c)
        assert plan.schedule.name == c.params["workload.schedule"]
        got[plan.schedule.name] = predict(plan, memory_limit=4)
    assert all(p["predicted_memory_ok"] for p in got.values())
    best = min(got[k]["predicted_iteration_time_s"] for k in ("crosspipe_greedy", "crosspipe_milp"))
    assert best <= 0.8 * got["1f1b"]["predicted_iteration_time_s"]


def test_worker_runs_the_planned_schedule_and_refuses_an_unplanned_cross_dc_one(tmp_path):
    from testbed.train.worker import WorkerFailure, _schedule  # imports torch: here, not at collection (tests/cudadevices.py)
    plan = plan_cell(_load(tmp_path, CROSS).cells[2])
    exp = plan.experiment
    cell = plan.cell_file()
    assert _schedule(cell, exp.workload).to_rows() == plan.schedule.to_rows()
    unplanned = cell.model_copy(update={"schedule": None})
    with pytest.raises(WorkerFailure, match="run it through the runner"):
        _schedule(unplanned, exp.workload)
    other = exp.workload.model_copy(update={"microbatches": 4})
    with pytest.raises(WorkerFailure, match="the workload says"):
        _schedule(cell, other)


def test_cross_dc_schedules_need_the_ir_executor(tmp_path):
    from testbed.errors import SpecError
    with pytest.raises(SpecError, match="needs executor: ir"):
        _load(tmp_path, CROSS.replace("memory_limit: 4", "memory_limit: 4\n  executor: torch"))


STEPPED = f"""\
name: t
topology:
  name: t
  dcs: [{{name: a, hosts: 1}}, {{name: b, hosts: 1}}]
  links:
    - {{dcs: [a, b], delay_ms: 5, steps: [{{at_iteration: 2, delay_ms: 40}}]}}
workload:
  parallel: {{pp: 2, dp: 1}}
  compute: {{forward_ms: 20, backward_ms: 40}}
"""


def test_at_iteration_steps_are_refused_where_the_backend_cannot_read_traces_live(tmp_path):
    """The backend says whether traces can be read while ranks run (Backend.traces_live): on
    this machine's namespaces they can; lab hosts bring them back at the end."""
    from testbed.errors import SpecError
    from testbed.plan import plan_all
    assert len(plan_all(_load(tmp_path, STEPPED))) == 1
    remote = STEPPED + f"backend: remote\nremote: {{inventory: {PROJECT_ROOT}/x.ini}}\n"
    with pytest.raises(SpecError, match="backend remote brings traces back at the end"):
        plan_all(_load(tmp_path, remote))
