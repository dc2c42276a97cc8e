"""Loading topology files (and a topology written inline in an experiment file): parse,
validate as a whole, turn link traces (``trace_csv``) into time-varying steps. Every problem
is raised at once as a :class:`testbed.errors.SpecError` with file, line and column.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

from pydantic import ValidationError

from testbed.errors import Problem, SpecError
from testbed.topology import Step, Topology
from testbed.spec.problems import pydantic_problems
from testbed.spec.source import Loc, Source, read_bounded, read_source

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# A link trace (trace_csv) is read whole and its steps are part of every cell (and hashed into
# its id): 64 KiB is 3,000-13,000 rows, more steps than a cell runs seconds (timeout_s defaults
# to 600), and a 6-cell file with a trace at the cap validates in well under 2 s here.
MAX_TRACE_BYTES = 64 << 10


def resolve_topology_path(ref: str, experiment_file: Path) -> Path | None:
    """Find a topology file: next to the experiment, in the current directory, in the project."""
    for base in (experiment_file.parent, Path.cwd(), PROJECT_ROOT):
        candidate = (base / ref).resolve()
        if candidate.is_file():
            return candidate
    return None


def load_topology(path: Path) -> Topology:
    """Load and validate a topology file; raises SpecError listing every problem."""
    src = read_source(Path(path))
    return validate_topology(src, ())


def validate_topology(src: Source, prefix: Loc) -> Topology:
    """The topology at ``prefix`` of ``src`` (() for a whole file), validated with its link
    traces; raises SpecError listing every problem."""
    data = src.data
    for p in prefix:
        data = data[p]
    if not isinstance(data, dict):
        raise SpecError([src.problem(prefix, "a topology must be a mapping (DCs, links)")])
    try:
        topo = Topology.model_validate(data, context={"defer_checks": True})
    except ValidationError as e:
        raise SpecError(pydantic_problems(e, src, prefix, Topology)) from None
    problems = [src.problem(prefix + loc, msg) for loc, msg in topo.problems()]
    problems += _load_link_traces(topo, src, prefix)
    if problems:
        raise SpecError(problems)
    return topo


def _load_link_traces(topo: Topology, src: Source, prefix: Loc) -> list[Problem]:
    """Turn each link's ``trace_csv`` (a file next to the YAML) into time-varying steps."""
    problems = []
    for i, link in enumerate(topo.links or []):
        if not link.trace_csv:
            continue
        loc = prefix + ("links", i, "trace_csv")
        path = Path(src.file).parent / link.trace_csv
        try:
            steps = link.steps + steps_from_csv(path)
            if any(st.at_s is None for st in steps):
                raise ValueError("a trace's steps are at_s; at_iteration steps cannot join it")
            link.steps = sorted(steps, key=lambda st: st.at_s)
        except (OSError, ValueError) as e:
            problems.append(src.problem(loc, f"trace {link.trace_csv}: {e}"))
    return problems


def steps_from_csv(path: Path) -> list[Step]:
    """Read a link trace: a CSV whose header has ``at_s`` and LinkProfile fields (delay_ms,
    rate_mbit, loss_pct, jitter_ms, …); empty cells leave a field unchanged. Raises OSError
    when it cannot be read, ValueError when it is not a regular UTF-8 file of at most
    MAX_TRACE_BYTES or names the row that is wrong."""
    try:
        text = read_bounded(path, MAX_TRACE_BYTES).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text (byte {e.start})") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if not reader.fieldnames or "at_s" not in reader.fieldnames:
        raise ValueError("needs a header row with an at_s column")
    steps = []
    for n, row in enumerate(reader, start=2):
        values = {k.strip(): v.strip() for k, v in row.items() if k and v and v.strip()}
        try:
            steps.append(Step(**values))
        except ValidationError as e:
            first = e.errors()[0]
            field_name = ".".join(str(x) for x in first["loc"])
            raise ValueError(f"row {n}, {field_name}: {first['msg']}") from None
    return steps
