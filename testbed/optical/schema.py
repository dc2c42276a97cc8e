"""JSON Schemas of the optical files, from their pydantic models (``optical schema``)."""
from __future__ import annotations

from testbed.optical.network import OpticalNetwork
from testbed.optical.spec import BlockingRun, OpticalExperiment

MODELS = {"experiment": OpticalExperiment, "blocking": BlockingRun, "network": OpticalNetwork}


def optical_schema(kind: str = "experiment") -> dict:
    """The JSON Schema of an optical ``kind`` file (experiment, blocking or network)."""
    schema = MODELS[kind].model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = f"testbed optical {kind}"
    return schema
