"""Files are read as written: YAML 1.2 core-schema scalars, and numbers are numbers.

PyYAML reads YAML 1.1, where ``010`` is 8, ``yes``/``on`` are booleans and ``1:30`` is 90;
pydantic's lax mode then takes a boolean as 1 or 0. The experiment and topology files'
hostile corpus (``bad/hostile_yaml11_*``, ``bad/hostile_bool_*``) runs these through
``validate`` (test_hostile.py); here each rule is checked directly and over every numeric
field of every model.
"""
from __future__ import annotations

import math
from pathlib import Path

import jsonschema
import pytest
from pydantic import ValidationError

from testbed.errors import SpecError
from testbed.topology.linkprofile import number_hint
from testbed.spec import json_schema, load_experiment, parse_yaml
from testbed.spec.topofile import steps_from_csv
from test_hostile import _file_models

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text,value", [
    ("010", 10), ("0o10", 8), ("0x1F", 31), ("+5", 5), ("-7", -7), ("007", 7),
    ("1e3", 1000.0), ("5.", 5.0), (".5", 0.5), ("-.INF", -math.inf), (".Inf", math.inf),
    ("true", True), ("False", False), ("TRUE", True), ("~", None), ("null", None), ("", None),
    # YAML 1.1's implicit types that YAML 1.2's core schema does not have: text
    ("yes", "yes"), ("no", "no"), ("on", "on"), ("off", "off"), ("y", "y"), ("n", "n"),
    ("Yes", "Yes"), ("OFF", "OFF"), ("1:30", "1:30"), ("190:20:30", "190:20:30"),
    ("1_000", "1_000"), ("0b101", "0b101"), ("2024-01-01", "2024-01-01"), ("tRue", "tRue"),
    ("-0o7", "-0o7"), ("=", "="), ("<<", "<<")])
def test_plain_scalars_are_read_as_yaml_1_2_core_schema(text, value):
    got = parse_yaml(f"a: {text}\n", "f.yaml").data["a"]
    assert got == value and type(got) is type(value), (text, got)


def test_nan_is_a_float():
    assert math.isnan(parse_yaml("a: .nan\n", "f.yaml").data["a"])


def test_yaml_1_1_keys_are_text_and_keep_their_positions():
    src = parse_yaml("on: 1\nyes:\n  010: 2\n", "f.yaml")
    assert src.data == {"on": 1, "yes": {10: 2}}
    assert src.where(("yes", 10)) == (3, 3)


def test_a_key_written_twice_in_two_spellings_of_one_integer_is_given_twice():
    with pytest.raises(SpecError) as e:
        parse_yaml("a:\n  010: 1\n  10: 2\n", "f.yaml")
    assert str(e.value) == "f.yaml:3:3 a[10]: key given twice"


def test_leading_zero_delay_is_decimal(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text("name: x\ntopology: topologies/two-dc.yaml\n"
                 "links: {inter_dc: {delay_ms: 010, rate_mbit: 0o1750}}\n", encoding="utf-8")
    links = load_experiment(f).experiment.links.inter_dc
    assert (links.delay_ms, links.rate_mbit) == (10, 1000)


def _numeric_fields(model) -> list[str]:
    def leaves(ann) -> set:
        args = getattr(ann, "__args__", ()) or ()
        return set().union(*(leaves(a) for a in args)) if args else {ann}
    return [n for n, f in model.model_fields.items()
            if {int, float} & leaves(f.annotation) and bool not in leaves(f.annotation)]


def _errors(model, name, value) -> list[dict]:
    try:
        model.model_validate({name: value})
    except ValidationError as e:
        return [err for err in e.errors() if err["loc"][:1] == (name,)]
    return []


@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_is_refused_in_every_numeric_field(value):
    checked = 0
    for model in _file_models():
        for name in _numeric_fields(model):
            errors = _errors(model, name, value)
            assert [e["type"] for e in errors] == ["bool_not_number"], \
                f"{model.__name__}.{name} accepts {value}: {errors}"
            assert errors[0]["msg"] == (f"{str(value).lower()} is a boolean, not a number; "
                                        "write 1 or 0")
            checked += 1
    assert checked >= 45  # int and float fields: counts, sizes, delays, rates, times, ...


@pytest.mark.parametrize("text,hint", [("yes", "1"), ("on", "1"), ("off", "0"), ("n", "0"),
                                       ("1:30", "90"), ("fast", "1")])
def test_a_word_is_refused_in_every_numeric_field_saying_what_to_write(text, hint):
    checked = 0
    for model in _file_models():
        for name in _numeric_fields(model):
            errors = _errors(model, name, text)
            assert [e["type"] for e in errors] == ["not_a_number"], f"{model.__name__}.{name}"
            assert errors[0]["msg"] == f"{text!r} is not a number; write a number such as {hint}"
            checked += 1
    assert checked >= 45


def test_the_boolean_field_still_takes_booleans(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text("name: x\ntopology: topologies/two-dc.yaml\nmeasure_links: false\n",
                 encoding="utf-8")
    assert load_experiment(f).experiment.measure_links is False


def test_numbers_as_text_in_link_traces_are_still_numbers_and_words_are_refused(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("at_s,delay_ms,rate_mbit\n1,10,100\n", encoding="utf-8")
    (st,) = steps_from_csv(trace)
    assert (st.at_s, st.delay_ms, st.rate_mbit) == (1, 10, 100)
    trace.write_text("at_s,delay_ms\n1,yes\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"row 2, delay_ms: 'yes' is not a number; write a "
                                         r"number such as 1$"):
        steps_from_csv(trace)


@pytest.mark.parametrize("text,hint", [("1:30", "90"), ("-1:30", "-90"), ("1:02:03", "3723"),
                                       ("1:30.5", "90.5"), ("NO", "0"), ("", "1")])
def test_number_hints(text, hint):
    assert number_hint(text) == hint


def _schema_errors(doc_text: str) -> list[str]:
    doc = parse_yaml("name: x\ntopology: topologies/two-dc.yaml\n" + doc_text, "f.yaml").data
    validator = jsonschema.Draft202012Validator(json_schema())
    return [e.message for e in validator.iter_errors(doc)]


@pytest.mark.parametrize("text", ["links: {inter_dc: {delay_ms: true}}",
                                  "links: {inter_dc: {delay_ms: yes}}",
                                  "links: {inter_dc: {rate_mbit: on}}",
                                  "workload: {microbatches: false}",
                                  "timeout_s: 1:30"])
def test_the_json_schema_refuses_what_validate_refuses(text, tmp_path):
    assert _schema_errors(text + "\n")
    f = tmp_path / "exp.yaml"
    f.write_text("name: x\ntopology: topologies/two-dc.yaml\n" + text + "\n", encoding="utf-8")
    with pytest.raises(SpecError):
        load_experiment(f)


def test_the_json_schema_takes_relative_delays_and_yaml_1_2_numbers():
    assert _schema_errors("links: {inter_dc: {delay_ms: 2xTF}}\n"
                          "workload: {compute: {forward_ms: 5, backward_ms: 1e1}, seed: 010}\n"
                          ) == []
