"""The JSON Schema of the experiment file, for editors (yaml-language-server).

It agrees with what ``validate`` accepts under YAML 1.2 (which editors read too): a number
field is ``number`` or ``integer``, and JSON Schema's numbers exclude booleans and text, as
testbed's do (``testbed.topology.linkprofile.Strict``); the one text a delay may be is a
multiple of one stage's forward time ('2xTF').
"""
from __future__ import annotations

from testbed.spec.models import Experiment
from testbed.topology.linkprofile import RELATIVE_DELAY


def json_schema() -> dict:
    """The JSON Schema of the experiment file: the models' schema, with ``topology`` also
    accepting a file path and ``matrix`` described by its keywords."""
    schema = Experiment.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "testbed experiment"
    props = schema["properties"]
    props["topology"] = {"anyOf": [{"type": "string", "description": "path to a topology file"},
                                   props["topology"]]}
    props["matrix"] = {
        "type": "object",
        "description": "dotted path → list of values (cartesian product); zip: groups varying "
                       "together; exclude: list of {path: value} to drop",
        "properties": {"zip": {"type": "array", "items": {"type": "object"}},
                       "exclude": {"type": "array", "items": {"type": "object"}}},
        "additionalProperties": {"type": "array", "minItems": 1},
    }
    for model in schema.get("$defs", {}).values():
        delay = model.get("properties", {}).get("delay_ms")
        for member in (delay or {}).get("anyOf", []):
            if member.get("type") == "string":
                member.update(pattern=RELATIVE_DELAY.pattern,
                              description="a multiple of one stage's forward time, e.g. '2xTF'")
    return schema
