"""The experiment file: typed models, loading with file:line:column errors, matrix expansion.

Nothing here touches the kernel or imports torch: ``validate``, ``plan`` and ``schema`` run
without root in well under a second. The parts:

- ``workload``: the training job's models;
- ``costs``: the torch-free cost arithmetic (parameters, FLOPs, message bytes, compute times)
  shared by spec, simulator and workers;
- ``models``: :class:`Experiment` and its sections;
- ``source``: positioned YAML (``yaml12``: its YAML 1.2 core scalars);
- ``problems``: pydantic errors as file:line:column problems;
- ``matrix``: matrix expansion and cell ids;
- ``load``: loading experiment files, cross-checks; ``topofile``: topology files;
- ``schema``: the JSON Schema for editors.
"""
from testbed.spec.load import LoadedExperiment, cross_checks, load_experiment
from testbed.spec.topofile import (PROJECT_ROOT, load_topology, resolve_topology_path,
                                   steps_from_csv)
from testbed.spec.matrix import ID_OPTIONAL_FIELDS, Cell, cell_id, path_exists
from testbed.spec.models import PLACEMENT_STRATEGIES, Experiment, LinkOverrides, Remote
from testbed.spec.schema import json_schema
from testbed.spec.source import Source, parse_yaml, read_source
from testbed.spec.workload import Compute, Filler, ModelSpec, Parallel, Workload
from testbed.spec.costs import ComputeTimes, message_bytes, stage_forward_ms

__all__ = [
    "PROJECT_ROOT", "LoadedExperiment", "cross_checks", "load_experiment", "load_topology",
    "resolve_topology_path", "steps_from_csv", "ID_OPTIONAL_FIELDS", "Cell", "cell_id",
    "path_exists", "PLACEMENT_STRATEGIES", "Experiment", "LinkOverrides", "Remote", "json_schema",
    "Source", "parse_yaml", "read_source", "Compute", "ComputeTimes", "Filler", "ModelSpec",
    "Parallel", "Workload", "message_bytes", "stage_forward_ms",
]
