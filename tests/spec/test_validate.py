"""The experiment file: every bad file is reported with file:line:column, field and reason."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testbed.__main__ import main
from testbed.errors import SpecError
from testbed.spec import json_schema, load_experiment, load_topology, parse_yaml

ROOT = Path(__file__).resolve().parents[2]
# hostile_*.yaml (binary, non-UTF-8, ...) have their own tests: test_hostile.py
BAD = sorted(p for p in (Path(__file__).parent / "bad").glob("*.yaml")
             if not p.name.startswith("hostile_"))


def _expected(path: Path) -> str:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} lacks its '# expect:' line"
    return first.removeprefix("# expect: ")


def test_corpus_has_at_least_25_bad_files():
    assert len(BAD) >= 25


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_validate_reports_bad_file_with_line_and_field(path, capsys):
    rc = main(["validate", str(path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"{path}:{_expected(path)}" in err, err


def test_validate_as_a_process_exits_2_without_traceback():
    bad = Path(__file__).parent / "bad" / "pp_does_not_divide_layers.yaml"
    r = subprocess.run([sys.executable, "-m", "testbed", "validate", str(bad)],
                       capture_output=True, text=True, cwd=ROOT, check=False)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "workload.parallel.pp: 3 stages do not divide 8 layers" in r.stderr


def test_validate_reports_every_problem_at_once(tmp_path):
    f = tmp_path / "many.yaml"
    f.write_text("name: x\ntopology: topologies/two-dc.yaml\nbackend: docker\n"
                 "links: {inter_dc: {loss_pct: 101, rate_mbit: 0}}\n", encoding="utf-8")
    with pytest.raises(SpecError) as e:
        load_experiment(f)
    paths = {p.path for p in e.value.problems}
    assert {"backend", "links.inter_dc.loss_pct", "links.inter_dc.rate_mbit"} <= paths


def test_matrix_cell_problem_points_at_the_matrix_line(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("name: x\ntopology: topologies/two-dc.yaml\nmatrix:\n"
                 "  workload.parallel.pp: [4, 3]\n", encoding="utf-8")
    with pytest.raises(SpecError) as e:
        load_experiment(f)
    (p,) = e.value.problems
    assert (p.line, p.path) == (4, "workload.parallel.pp")
    assert "3 stages do not divide 8 layers" in p.message


# optical-*.yaml are `optical sweep` files (docs/optical.md), the rest `run` files
YAMLS = sorted(p for p in (ROOT / "experiments").glob("*.yaml")
               if not p.name.startswith("optical-"))
OPTICAL = sorted((ROOT / "experiments").glob("optical-*.yaml"))
TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yaml"))


@pytest.mark.parametrize("path", YAMLS, ids=[p.stem for p in YAMLS])
def test_every_shipped_experiment_validates(path):
    assert load_experiment(path).cells


@pytest.mark.parametrize("path", OPTICAL, ids=[p.stem for p in OPTICAL])
def test_every_shipped_optical_experiment_validates(path):
    from testbed.optical.load import load_optical
    from testbed.optical.sweep import cells

    assert cells(load_optical(path))


@pytest.mark.parametrize("path", TOPOLOGIES, ids=[p.stem for p in TOPOLOGIES])
def test_every_shipped_topology_validates(path):
    assert load_topology(path).dcs


def test_schema_is_valid_json_schema_and_accepts_quickstart():
    import jsonschema

    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    quickstart = ROOT / "experiments" / "quickstart.yaml"
    doc = parse_yaml(quickstart.read_text(), str(quickstart)).data  # YAML 1.2, as editors
    jsonschema.validate(doc, schema)
