"""Hostile input files: each is refused quickly with exit 2 and a one-line file:line:col message.

The kept set is ``bad/hostile_*.yaml`` (experiment files) and ``bad/topologies/hostile_*.yaml``
(topology files, loaded through the same reader); the first line of each says what ``validate``
must print (``# expect: LINE:COL MESSAGE``). FIFOs and oversized files cannot be kept in git, so
those are made in ``tmp_path``.
"""
from __future__ import annotations

import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from testbed.errors import SpecError
from testbed.topology import Strict, Topology
from testbed.spec import Experiment, load_experiment, parse_yaml
from testbed.spec.topofile import MAX_TRACE_BYTES
from testbed.spec.problems import model_in
from testbed.spec.source import MAX_YAML_BYTES, size_text

ROOT = Path(__file__).resolve().parents[2]
BAD = Path(__file__).parent / "bad"
HOSTILE = sorted(BAD.glob("hostile_*.yaml"))
HOSTILE_TOPOLOGIES = sorted((BAD / "topologies").glob("hostile_*.yaml"))
# Binary garbage cannot carry an "# expect:" line.
EXPECT_WITHOUT_COMMENT = {
    "hostile_binary_garbage.yaml": "1:1 not UTF-8 text: byte 0xb9 (save the file as UTF-8)"}

# The requirement: `validate` refuses a hostile file within 2 s. The child's CPU time (user +
# sys) is held to it directly: load on the box barely changes it (0.4-0.8 s here, 1.0 s for
# the densest YAML at the size cap: results/benchmarks/bench_hostile.md; CI measured 2.2 s for
# that one before libyaml's parser read it).
VALIDATE_SPEC_S = 2.0
# Wall time also catches a child that blocks without using CPU (a FIFO opened for reading).
# Alone it is 0.2-0.7 s here; four validations at once beside other developers' test runs took
# up to 4.0 s on this 2-core box, so the wall bound is the spec with 3x slack. Before the fixes
# these files hung (alias expansion, matrix, /dev/zero, FIFO) or failed fast with exit 1.
BUSY_MACHINE_SLACK = 3.0
# These tests are quiet (tests/machineshare.py): under pytest-xdist they run on one worker
# beside the `alone` tests only, which use less than one of the two cores, and before the
# suite's busy second phase.


def _expected(path: Path) -> str:
    if path.name in EXPECT_WITHOUT_COMMENT:
        return EXPECT_WITHOUT_COMMENT[path.name]
    first = path.read_bytes().split(b"\n", 1)[0].decode("utf-8")
    assert first.startswith("# expect: "), f"{path.name} lacks its '# expect:' line"
    return first.removeprefix("# expect: ")


def _validate(path: Path) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run `python -m testbed validate PATH`; returns (result, wall s, child CPU s)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "testbed", "validate", str(path)],
                       capture_output=True, text=True, cwd=ROOT, check=False,
                       timeout=2 * VALIDATE_SPEC_S * BUSY_MACHINE_SLACK)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return r, wall, cpu


def _assert_refused_quickly(path: Path, expected_line: str) -> None:
    r, wall, cpu = _validate(path)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    # one line naming the problem, then the count
    assert r.stderr.splitlines() == [expected_line, "1 problem found"], r.stderr
    assert cpu < VALIDATE_SPEC_S, f"{cpu:.2f} s of CPU"
    assert wall < VALIDATE_SPEC_S * BUSY_MACHINE_SLACK, f"{wall:.2f} s"


def test_every_class_of_hostile_file_is_kept():
    names = {p.stem.removeprefix("hostile_") for p in HOSTILE}
    assert {"billion_laughs", "not_utf8", "binary_garbage", "deeply_nested", "nan_delay",
            "trace_csv_device", "matrix_millions", "huge_integer",
            # YAML 1.1's readings (yes, 1:30, 010) and booleans taken as numbers
            "yaml11_yes_delay", "yaml11_base60_delay", "yaml11_octal_pp", "bool_rate",
            "bool_microbatches", "bool_forward_ms", "matrix_yes_delay",
            # and booleans written as YAML 1.1's words or as numbers
            "yaml11_yes_bool", "number_bool", "matrix_on_bool",
            "matrix_bool_microbatches"} <= names
    assert {p.stem.removeprefix("hostile_") for p in HOSTILE_TOPOLOGIES} >= {
        "bool_hosts", "yaml11_off_loss"}


@pytest.mark.parametrize("path", HOSTILE, ids=[p.stem for p in HOSTILE])
def test_hostile_experiment_file_exits_2_quickly_with_one_line(path):
    _assert_refused_quickly(path, f"{path}:{_expected(path)}")


@pytest.mark.parametrize("path", HOSTILE_TOPOLOGIES, ids=[p.stem for p in HOSTILE_TOPOLOGIES])
def test_hostile_topology_file_exits_2_quickly_with_one_line(path, tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(f"name: x\ntopology: {path}\n", encoding="utf-8")
    _assert_refused_quickly(exp, f"{path}:{_expected(path)}")


def _experiment_with_trace(tmp_path: Path) -> Path:
    """An experiment whose topology's one link reads ``tmp_path/trace.csv``."""
    (tmp_path / "topo.yaml").write_text(
        "name: t\ndcs: [{name: dc1, hosts: 4}, {name: dc2, hosts: 4}]\n"
        "links:\n  - dcs: [dc1, dc2]\n    trace_csv: trace.csv\n", encoding="utf-8")
    exp = tmp_path / "exp.yaml"
    exp.write_text("name: x\ntopology: topo.yaml\n", encoding="utf-8")
    return exp


def _trace_problem(tmp_path: Path, trace_text: str) -> str:
    """The one problem loading reports for a trace.csv holding ``trace_text``."""
    (tmp_path / "trace.csv").write_text(trace_text, encoding="utf-8")
    with pytest.raises(SpecError) as e:
        load_experiment(_experiment_with_trace(tmp_path))
    (p,) = e.value.problems
    return p.message


def test_trace_csv_naming_a_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "trace.csv")  # opened for reading, a FIFO blocks until a writer comes
    _assert_refused_quickly(_experiment_with_trace(tmp_path),
                            f"{tmp_path / 'topo.yaml'}:5:5 links[0].trace_csv: trace "
                            "trace.csv: a FIFO, not a regular file")


def test_trace_csv_over_the_size_cap_is_refused_naming_the_cap(tmp_path):
    rows = "1,10\n" * 1000
    assert _trace_problem(tmp_path, "at_s,delay_ms\n" + rows * (MAX_TRACE_BYTES // len(rows) + 1)) \
        == f"trace trace.csv: larger than the {size_text(MAX_TRACE_BYTES)} cap"


def test_trace_csv_at_the_size_cap_is_read(tmp_path):
    header, row = "at_s,delay_ms\n", "1,10\n"
    n = (MAX_TRACE_BYTES - len(header)) // len(row)
    (tmp_path / "trace.csv").write_text(header + row * n, encoding="utf-8")
    le = load_experiment(_experiment_with_trace(tmp_path))
    assert len(le.experiment.topology.links[0].steps) == n


@pytest.mark.parametrize("column,value", [("delay_ms", "nan"), ("delay_ms", "inf"),
                                          ("rate_mbit", "nan"), ("at_s", "inf")])
def test_trace_csv_non_finite_numbers_are_refused(tmp_path, column, value):
    row = {"at_s": "1", "delay_ms": "10", "rate_mbit": "100", column: value}
    assert _trace_problem(tmp_path, "at_s,delay_ms,rate_mbit\n" + ",".join(row.values()) + "\n") \
        == f"trace trace.csv: row 2, {column}: Input should be a finite number"


def test_experiment_file_over_the_size_cap_is_refused_naming_the_cap(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("name: x\ntopology: topologies/two-dc.yaml\ndescription: "
                   + "x" * MAX_YAML_BYTES + "\n", encoding="utf-8")
    with pytest.raises(SpecError) as e:
        load_experiment(big)
    assert str(e.value) == f"{big} cannot read: larger than the {size_text(MAX_YAML_BYTES)} cap"


def test_size_caps_read_as_kib_or_mib():
    assert (size_text(64 << 10), size_text(1 << 20), size_text(1000)) == (
        "64 KiB", "1 MiB", "1000 bytes")


def test_densest_yaml_at_the_size_cap_is_refused_within_the_bound(tmp_path):
    # PyYAML is pure Python: the size cap is what bounds parsing time; "0," is its slowest
    # input per byte
    head = "name: x\ntopology: topologies/two-dc.yaml\ndescription: ["
    dense = tmp_path / "dense.yaml"
    dense.write_text(head + "0," * ((MAX_YAML_BYTES - len(head) - 3) // 2) + "0]\n",
                     encoding="utf-8")
    assert MAX_YAML_BYTES - 3 <= dense.stat().st_size <= MAX_YAML_BYTES
    _assert_refused_quickly(dense, f"{dense}:3:1 description: input should be a valid string")


def test_experiment_file_that_is_a_device_is_refused():
    with pytest.raises(SpecError) as e:
        load_experiment(Path("/dev/zero"))
    assert str(e.value) == "/dev/zero cannot read: a character device, not a regular file"


def test_a_single_alias_is_refused_too():
    # Anchors and aliases are refused outright, not only when they expand a lot: an aliased
    # mapping is shared, so a matrix value set through one path would change the other.
    with pytest.raises(SpecError) as e:
        parse_yaml("a: &x {delay_ms: 5}\nb: *x\n", "f.yaml")
    assert str(e.value).startswith("f.yaml:1:4 YAML anchors (&name) and aliases")


@pytest.mark.parametrize("text,message", [
    ("seed: 9223372036854775808\n", "1:7 cannot read this value: integers must fit in 64 bits "
                                     "(this one has 64)"),
    # YAML 1.2 has no implicit dates (2000-13-45 is a string): only a tagged one is read
    ("seed: !!timestamp 2000-13-45\n", "1:7 cannot read this value: month must be in 1..12"),
    ("seed: !!int yes\n", "1:7 cannot read this value: 'yes' is not an integer")])
def test_values_python_cannot_construct_are_reported_at_their_position(text, message):
    with pytest.raises(SpecError) as e:
        parse_yaml(text, "f.yaml")
    assert str(e.value) == f"f.yaml:{message}"


def test_a_64_bit_integer_is_read():
    assert parse_yaml("seed: 9223372036854775807\n", "f.yaml").data == {"seed": 2**63 - 1}


def test_long_values_are_shortened_in_messages(tmp_path):
    f = tmp_path / "long.yaml"
    f.write_text("name: " + "x" * 5000 + "\ntopology: topologies/two-dc.yaml\n", encoding="utf-8")
    with pytest.raises(SpecError) as e:
        load_experiment(f)
    assert str(e.value) == (f"{f}:1:1 name: string should have at most 64 characters (got '"
                            + "x" * 79 + "…)")


def test_nesting_up_to_the_cap_is_accepted():
    depth = 32  # MAX_YAML_DEPTH: the root mapping is level 1
    text = "a: " + "[" * (depth - 1) + "]" * (depth - 1) + "\n"
    assert parse_yaml(text, "f.yaml").data["a"] is not None
    with pytest.raises(SpecError):
        parse_yaml("a: " + "[" * depth + "]" * depth + "\n", "f.yaml")


def _file_models() -> set[type[BaseModel]]:
    """Every model reachable from the experiment file's fields (topology included)."""
    seen: set[type[BaseModel]] = set()
    todo: list[type[BaseModel]] = [Experiment, Topology]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo += [found for f in m.model_fields.values()
                 for found in [model_in(f.annotation)] if found is not None]
        todo += [sub for sub in m.__subclasses__() if issubclass(sub, Strict)]
    return seen


def _float_fields(model: type[BaseModel]) -> list[str]:
    def has_float(ann) -> bool:
        return ann is float or any(has_float(a) for a in getattr(ann, "__args__", ()) or ())
    return [name for name, f in model.model_fields.items() if has_float(f.annotation)]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_numbers_are_refused_in_every_float_field(value):
    checked = 0
    for model in _file_models():
        for name in _float_fields(model):
            try:
                model.model_validate({name: value})
                errors = []
            except ValidationError as e:
                errors = e.errors()
            assert any(err["loc"][:1] == (name,) and err["type"] == "finite_number"
                       for err in errors), f"{model.__name__}.{name} accepts {value}"
            checked += 1
    assert checked >= 20  # the walk found the float fields (delay, rate, loss, times, ...)


@pytest.mark.slow
@pytest.mark.root
def test_hostile_file_builds_nothing(tmp_path):
    # `run` loads the file before it creates the results directory, and the results directory
    # before any network: a run refused at loading leaves no directory. (Namespace lists are
    # not compared: other developers' tests create namespaces on this machine meanwhile.)
    results = tmp_path / "results"
    for path in HOSTILE:
        r = subprocess.run([sys.executable, "-m", "testbed", "run", str(path), "--results",
                            str(results)], capture_output=True, text=True, cwd=ROOT, check=False,
                           timeout=60)
        assert r.returncode == 2, (path.name, r.stderr)
        assert "Traceback" not in r.stderr
        assert not results.exists(), path.name
