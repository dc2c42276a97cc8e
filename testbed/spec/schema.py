"""The JSON Schema of the experiment file, for editors (yaml-language-server)."""
from __future__ import annotations

from testbed.spec.models import Experiment


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
    return schema
