"""``optical sweep|blocking|validate|schema``: outputs, and bad input as exit 2 with a message
(never a traceback)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from testbed.__main__ import main
from testbed.optical.sweep import COLUMNS

HERE = Path(__file__).parent
TINY = (HERE / "tiny.yaml").read_text(encoding="utf-8")


def test_sweep_writes_rows_plot_and_comparison(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["optical", "sweep", str(HERE / "tiny.yaml"), "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "results.csv").open(encoding="utf-8")))
    assert list(rows[0]) == list(COLUMNS)
    assert len(rows) == 3 * 2 * 2
    assert {r["policy"] for r in rows} == {"ksp_ff", "ksp_ff+cba",
                                          "../../examples/optical_policy.py"}
    assert all(float(r["blocking_job"]) == 0 for r in rows)   # no background, 16 slots
    assert (out / "plot.png").stat().st_size > 10_000
    assert "| ksp_ff | 60 | gpipe | 2 |" in (out / "comparison.md").read_text(encoding="utf-8")
    assert json.loads((out / "setup.json").read_text())["stage_dcs"] == ["east", "west"]
    err = capsys.readouterr().err
    assert "[12/12] ../../examples/optical_policy.py" in err   # progress, one line per cell


def test_the_example_policy_is_used_as_written(tmp_path):
    """Backward transfers ask for the ceiling (6), forward ones the initial 3."""
    out = tmp_path / "out"
    assert main(["optical", "sweep", str(HERE / "tiny.yaml"), "--out", str(out), "--quiet"]) == 0
    rows = {(r["policy"], r["schedule"], r["microbatches"]): r
            for r in csv.DictReader((out / "results.csv").open(encoding="utf-8"))}
    assert float(rows[("../../examples/optical_policy.py", "gpipe", "2")]["mean_slots"]) == 4.5
    assert float(rows[("ksp_ff", "gpipe", "2")]["mean_slots"]) == 3.0


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "exp.yaml"
    p.write_text(text, encoding="utf-8")
    return p


BAD = [
    (TINY.replace("iterations: 4", "iterations: 4\nbogus: 1"),
     "exp.yaml:16:1 bogus: unknown key"),
    (TINY.replace("policy: [ksp_ff,", "policy: [ksp_gg,"), "unknown policy 'ksp_gg'"),
    (TINY.replace("[east, west]", "[east, north]"), "unknown DC 'north'"),
    (TINY.replace("{a: b, b: c, km: 200}", "{a: b, b: d, km: 200}"), "unknown node 'd'"),
    (TINY.replace("forward_ms: 2", "forward_ms: -2"), "job.forward_ms"),
    (TINY.replace("microbatches: [2, 4]", "microbatches: [0]"), "at least 1"),
    (TINY.replace("slots: 16", "slots: 4"), "job.slots.high: more than the 3 slots"),
    (TINY.replace("../../examples/optical_policy.py", "nothere.py"), "does not exist"),
    ("- just\n- a list\n", "must be a mapping"),
]


@pytest.mark.parametrize("text, expected", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_exits_2_with_a_clear_message(tmp_path, capsys, text, expected):
    assert main(["optical", "sweep", str(_write(tmp_path, text)), "--out",
                 str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


def test_a_missing_file_exits_2(tmp_path, capsys):
    assert main(["optical", "validate", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_a_policy_that_raises_exits_2_naming_it(tmp_path, capsys):
    (tmp_path / "broken.py").write_text(
        "from testbed.optical.policy import Policy\n\n"
        "class Broken(Policy):\n    def slots(self, transfer):\n        return 1 / 0\n",
        encoding="utf-8")
    exp = _write(tmp_path, TINY.replace("../../examples/optical_policy.py", "broken.py"))
    assert main(["optical", "sweep", str(exp), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "policy broken.py: slots() raised ZeroDivisionError" in err


def test_a_policy_file_that_does_not_load_exits_2(tmp_path, capsys):
    (tmp_path / "syntax.py").write_text("def (:\n", encoding="utf-8")
    exp = _write(tmp_path, TINY.replace("../../examples/optical_policy.py", "syntax.py"))
    assert main(["optical", "validate", str(exp)]) == 2
    assert "fails to load: SyntaxError" in capsys.readouterr().err


def test_schema_lists_every_field(capsys):
    assert main(["optical", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert {"network", "job", "background", "sweep"} <= set(schema["properties"])


def test_several_loads_get_a_plot_against_the_load(tmp_path):
    text = TINY.replace("background: {kind: none}",
                        "background: {kind: poisson, load: 5, slots: [4, 8]}")
    text = text.replace("  microbatches: [2, 4]", "  microbatches: [2]\n  load: [5, 50]")
    text = text.replace(", ../../examples/optical_policy.py", "")
    out = tmp_path / "out"
    assert main(["optical", "sweep", str(_write(tmp_path, text)), "--out", str(out),
                 "--quiet"]) == 0
    rows = list(csv.DictReader((out / "results.csv").open(encoding="utf-8")))
    assert sorted({float(r["load"]) for r in rows}) == [5, 50]
    assert (out / "plot-load.png").is_file()


def test_the_comparison_skips_changes_that_are_not_numbers():
    from testbed.optical.report import comparison_md
    row = {"load": 0.0, "schedule": "gpipe", "microbatches": 2, "blocking_job": 0.0}
    rows = [dict(row, policy="ksp_ff", iteration_time_s=2.0, blocking_all=0.0),
            dict(row, policy="ksp_ff+cba", iteration_time_s=1.5, blocking_all=0.0),
            dict(row, policy="sd_ff", iteration_time_s=2.0, blocking_all=0.5, microbatches=4),
            dict(row, policy="sd_ff+cba", iteration_time_s=2.0, blocking_all=0.25,
                 microbatches=4)]
    text = comparison_md(rows)
    assert "Best iteration-time change here: -25.00 %" in text
    assert "best change of all requests' blocking: -50.00 %" in text
    assert "| ksp_ff | 0 | gpipe | 2 | -25.00 % | n/a | n/a |" in text


def test_each_finished_cell_is_on_disk_before_the_next_starts(tmp_path, monkeypatch):
    from testbed.optical import sweep
    out, seen = tmp_path / "out", []
    real = sweep.run_cell

    def spy(lo, cell):
        path = out / "results.csv"
        seen.append(len(path.read_text().splitlines()) - 1 if path.exists() else 0)
        return real(lo, cell)
    monkeypatch.setattr(sweep, "run_cell", spy)
    assert main(["optical", "sweep", str(HERE / "tiny.yaml"), "--out", str(out), "--quiet"]) == 0
    assert seen == list(range(12))
