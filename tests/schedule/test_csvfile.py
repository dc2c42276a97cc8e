"""Your own schedule as a file (workload.schedule_file): torch's compute-only CSV, checked by
validate with file:line:col, planned and predicted like a built-in one."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.__main__ import main
from testbed.launch.loopback import run_local
from testbed.readout.traces import load_traces, losses
from testbed.plan import plan_all
from testbed.schedule.csvfile import read_csv, to_csv, write_csv
from testbed.schedule.filecheck import Shape
from testbed.schedule.generators import generate
from testbed.spec import Compute, ModelSpec, Parallel, Workload, load_experiment

ROOT = Path(__file__).resolve().parents[2]
# bubble of a CSV copy of a built-in schedule vs the built-in: the acceptance's 1 pp
SAME_BUBBLE_PP = 0.01

EXPERIMENT = """name: mine
backend: netns
topology: {root}/topologies/two-dc.yaml
links:
  inter_dc: {{delay_ms: 5, rate_mbit: 1000}}
workload:
  parallel: {{pp: 4, dp: 1}}
  {schedule}
  microbatches: 8
  {extra}
  compute: {{mode: emulated, forward_ms: 20, backward_ms: 40, bytes_scale: 0.01}}
  iterations: 3
"""

BUILT_IN = [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("interleaved_1f1b", 2, 4, 2),
            ("zb_h1", 2, 4, 2), ("zbv", 2, 4, 2), ("dualpipev", 2, 4, 2)]


def _experiment(tmp_path: Path, schedule: str, extra: str = "") -> Path:
    f = tmp_path / "exp.yaml"
    f.write_text(EXPERIMENT.format(root=ROOT, schedule=schedule, extra=extra), encoding="utf-8")
    return f


@pytest.mark.parametrize("name,pp,m,chunks", BUILT_IN, ids=[b[0] for b in BUILT_IN])
def test_export_reads_back_and_torch_accepts_it(tmp_path, name, pp, m, chunks):
    # imported here, not at collection, which every pytest-xdist worker makes
    from torch.distributed.pipelining.schedules import _Action, _validate_schedule
    out = tmp_path / f"{name}.csv"
    assert main(["schedule", "export", name, "--pp", str(pp), "--microbatches", str(m),
                 "--chunks", str(chunks), "-o", str(out)]) == 0
    built = generate(name, pp, m, chunks)
    assert read_csv(out, Shape(pp, chunks, m)).actions == built.actions
    with open(out, newline="") as f:  # what torch's _load_csv does with it
        order = {r: [_Action.from_str(s) for s in row] for r, row in enumerate(csv.reader(f))}
    mapping = _validate_schedule(order, pp, pp * chunks, m)
    assert [mapping[s] for s in range(pp * chunks)] == built.stage_to_rank


def test_csv_equal_to_gpipe_plans_the_same_order_and_bubble(tmp_path):
    write_csv(generate("gpipe", 4, 8), tmp_path / "mine.csv")
    mine = plan_all(load_experiment(_experiment(tmp_path, "schedule_file: mine.csv")))[0]
    gpipe = plan_all(load_experiment(_experiment(tmp_path, "schedule: gpipe")))[0]
    assert mine.schedule.actions == gpipe.schedule.actions
    assert mine.schedule.stage_to_rank == gpipe.schedule.stage_to_rank
    assert abs(mine.prediction["predicted_bubble_ratio"]
               - gpipe.prediction["predicted_bubble_ratio"]) < SAME_BUBBLE_PP
    assert mine.cell_file().planned_schedule().actions == gpipe.schedule.actions


def _gpipe_rows() -> list[list[str]]:
    return generate("gpipe", 4, 8).to_rows()


def _swap(rows, r, i, j):
    rows[r][i], rows[r][j] = rows[r][j], rows[r][i]
    return rows


def _edit(fn):
    rows = _gpipe_rows()
    fn(rows)
    return "\n".join(",".join(r) for r in rows) + "\n"


# (id, csv text, memory_limit line, expected "line:col" and message part)
MALFORMED = [
    ("malformed_action", _edit(lambda r: r[1].__setitem__(2, "1F")), "", "2:9", "not an action"),
    ("unknown_kind", _edit(lambda r: r[2].__setitem__(0, "2X0")), "", "3:1", "not an action"),
    ("comm_action", _edit(lambda r: r[0].__setitem__(15, "0SEND_F7")), "", "1:61",
     "compute-only"),
    ("missing_forward", _edit(lambda r: r[3].pop(4)), "", "4:1", "lacks 3F4"),
    ("repeated_backward", _edit(lambda r: r[0].__setitem__(9, "0B0")), "", "1:37",
     "0B0 is repeated"),
    ("too_many_stages", _edit(lambda r: r.append([a.replace("3", "4", 1) for a in r[3]])), "",
     "5:1", "5 rows"),
    ("stage_out_of_range", _edit(lambda r: r.__setitem__(3, [a.replace("3", "4", 1)
                                                            for a in r[3]])), "", "4:1",
     "stage 4 out of range"),
    ("deadlock", _edit(lambda r: _swap(r, 1, 0, 8)), "", "2:1", "deadlock: rank 1"),
    ("over_memory_limit", _edit(lambda r: None), "memory_limit: 4", "1:17",
     "over memory_limit=4"),
]


@pytest.mark.parametrize("text,extra,where,message", [m[1:] for m in MALFORMED],
                         ids=[m[0] for m in MALFORMED])
def test_malformed_csv_exits_2_with_file_line_col(tmp_path, text, extra, where, message):
    (tmp_path / "mine.csv").write_text(text, encoding="utf-8")
    exp = _experiment(tmp_path, "schedule_file: mine.csv", extra)
    r = subprocess.run([sys.executable, "-m", "testbed", "validate", str(exp)],
                       capture_output=True, text=True, cwd=ROOT, check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    line = next(ln for ln in r.stderr.splitlines() if message in ln)
    assert line.startswith(f"{tmp_path / 'mine.csv'}:{where} workload.schedule_file"), r.stderr


def test_schedule_and_schedule_file_are_exclusive(tmp_path):
    write_csv(generate("gpipe", 4, 8), tmp_path / "mine.csv")
    exp = _experiment(tmp_path, "schedule_file: mine.csv\n  schedule: gpipe")
    assert main(["validate", str(exp)]) == 2


def test_py_schedule_gets_the_cross_dc_context(tmp_path):
    (tmp_path / "mine.py").write_text(
        "def schedule(pp, chunks, microbatches, context):\n"
        "    assert context is None or context.boundaries[1].delay_ms == 5\n"
        "    return [[f'{r}F{i}' for i in range(microbatches)] +\n"
        "            [f'{r}B{i}' for i in range(microbatches)] for r in range(pp)]\n",
        encoding="utf-8")
    plan = plan_all(load_experiment(_experiment(tmp_path, "schedule_file: mine.py")))[0]
    assert plan.schedule.actions == generate("gpipe", 4, 8).actions


def test_to_csv_is_torch_dump_format():
    # torch's _dump_csv writes with csv.writer's defaults: comma-separated, CRLF rows
    assert to_csv(generate("gpipe", 2, 2)) == "0F0,0F1,0B0,0B1\r\n1F0,1F1,1B0,1B1\r\n"


def test_matrix_sweeps_schedule_file(tmp_path):
    write_csv(generate("gpipe", 4, 8), tmp_path / "a.csv")
    write_csv(generate("1f1b", 4, 8), tmp_path / "b.csv")
    exp = _experiment(tmp_path, "schedule_file: a.csv")
    exp.write_text(exp.read_text() + "matrix:\n  workload.schedule_file: [a.csv, b.csv]\n")
    plans = plan_all(load_experiment(exp))
    assert [p.schedule.actions for p in plans] == [generate(n, 4, 8).actions
                                                    for n in ("gpipe", "1f1b")]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("executor", ["ir", "torch"])
def test_a_csv_schedule_trains_like_the_built_in_one(rank_pool, tmp_path, executor):
    # zbv as a CSV (I/W actions, two chunks per rank in a V): the torch executor loads it into
    # torch's runtime with _load_csv; both must see the built-in zbv's losses
    model = ModelSpec(layers=4, hidden=32, heads=2, seq_len=16, vocab=64)
    base = dict(model=model, parallel=Parallel(pp=2), chunks=2, microbatches=4, iterations=3,
                warmup=1, compute=Compute(mode="real"), executor=executor)
    built = Workload(schedule="zbv", **base)
    run_local(built, tmp_path / "built", timeout_s=120, pool=rank_pool)
    csv_path = write_csv(generate("zbv", 2, 4, 2), tmp_path / "zbv.csv")
    mine = Workload(schedule_file=str(csv_path), **base)
    schedule = read_csv(csv_path, Shape(2, 2, 4), name=mine.schedule)
    run_local(mine, tmp_path / "mine", timeout_s=120, schedule=schedule, pool=rank_pool)
    assert losses(tmp_path / "mine") == pytest.approx(losses(tmp_path / "built"), rel=1e-5)
    # losses do not depend on the order: the traces show the CSV's order is what ran
    for rank, recs in load_traces(tmp_path / "mine").items():
        ran = [f"{r['stage']}{r['kind']}{r['mb']}" for r in recs
               if r.get("type") == "action" and r["iter"] == 1 and r["kind"] in ("F", "B", "I", "W")]
        assert ran == [str(a) for a in schedule.actions[rank]], rank


def test_an_edited_schedule_file_is_another_cell(tmp_path):
    write_csv(generate("gpipe", 4, 8), tmp_path / "mine.csv")
    exp = _experiment(tmp_path, "schedule_file: mine.csv")
    before = load_experiment(exp).cells[0].cell_id
    write_csv(generate("1f1b", 4, 8), tmp_path / "mine.csv")
    assert load_experiment(exp).cells[0].cell_id != before
