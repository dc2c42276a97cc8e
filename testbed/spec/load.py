"""Loading experiment files: parse, validate, cross-check, expand the matrix.

``topology`` in an experiment file is a path (relative to the experiment file, then to the
current directory, then to the project) or an inline mapping with the fields of
:class:`testbed.topology.Topology` (topology files: ``testbed.spec.topofile``). Every problem
is collected and raised at once as a :class:`testbed.errors.SpecError` whose problems carry
file, line and column.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from testbed.errors import Problem, SpecError
from testbed.topology import MAX_DELAY_MS, Topology
from testbed.schedule.csvfile import ScheduleFileError, load_py, read_csv
from testbed.schedule.filecheck import Shape
from testbed.schedule.registry import schedule_problems
from testbed.spec.matrix import Cell, cell_id, params_text, parse_matrix
from testbed.spec.models import Experiment, map_problems
from testbed.spec.problems import pydantic_problems
from testbed.spec.source import Loc, Source, read_source
from testbed.spec.workload import MAX_RANKS, Workload
from testbed.spec.costs import stage_forward_ms
from testbed.spec.topofile import load_topology, resolve_topology_path, validate_topology



@dataclass
class LoadedExperiment:
    """A validated experiment file and its cells."""

    path: Path
    experiment: Experiment
    cells: list[Cell]


def load_experiment(path: Path) -> LoadedExperiment:
    """Load, validate and expand an experiment file.

    Raises SpecError holding every problem found (file, line, column, field path, message),
    including problems that only appear in some matrix cells.
    """
    path = Path(path)
    src = read_source(path)
    if not isinstance(src.data, dict):
        raise SpecError([Problem(str(path), 1, 1, "", "an experiment file must be a mapping")])
    problems: list[Problem] = []
    topo = _experiment_topology(src, path, problems)
    base = _validate_experiment(src, src.data, topo, problems, cell_params=None)
    cells = _expand(src, topo, problems) if base is not None else []
    if problems or base is None:
        raise SpecError(_unique(problems))
    return LoadedExperiment(path, base, cells)


def _unique(problems: list[Problem]) -> list[Problem]:
    seen, out = set(), []
    for p in problems:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return sorted(out, key=lambda p: (p.file != out[0].file, p.line, p.column))


def _experiment_topology(src: Source, path: Path, problems: list[Problem]) -> Topology | None:
    ref = src.data.get("topology")
    if ref is None:
        problems.append(Problem(str(path), 1, 1, "topology",
                                "required; a topology file path or an inline mapping"))
        return None
    try:
        if isinstance(ref, str):
            found = resolve_topology_path(ref, path)
            if found is None:
                problems.append(src.problem(("topology",), f"topology file {ref!r} not found "
                                            f"(looked next to {path.name}, in the current "
                                            "directory and in the project)"))
                return None
            return load_topology(found)
        return validate_topology(src, ("topology",))
    except SpecError as e:
        problems.extend(e.problems)
        return None


# ---------------------------------------------------------------- one document


_PLACEHOLDER_TOPOLOGY = Topology(name="placeholder", dcs=[{"name": "dc", "hosts": 64}])


def _validate_experiment(src: Source, data: dict, topo: Topology | None,
                         problems: list[Problem], cell_params: dict | None) -> Experiment | None:
    """Validate one (possibly matrix-modified) document. Problems in a cell point at the
    matrix entry that set the offending value, when one did."""
    data = dict(data, topology=topo if topo is not None else _PLACEHOLDER_TOPOLOGY)
    found: list[Problem] = []
    try:
        # the topology was checked once when it was read (its problems carry its own file's
        # positions); pydantic would run those checks again for every cell
        exp = Experiment.model_validate(data, context={"defer_checks": True})
    except ValidationError as e:
        found = pydantic_problems(e, src, (), Experiment)
        exp = None
    if exp is not None:
        exp.workload.set_base_dir(Path(src.file).parent)
    if exp is not None and topo is not None:
        found += [src.problem(loc, msg) for loc, msg in cross_checks(exp)]
        found += schedule_file_problems(src, exp.workload) if not found else []
    problems.extend(_in_cell(p, src, cell_params) for p in found)
    return exp if not found else None


def _in_cell(p: Problem, src: Source, cell_params: dict | None) -> Problem:
    if not cell_params:
        return p
    if p.file != str(src.file):  # inside another file (a schedule file): keep its position
        return Problem(p.file, p.line, p.column, p.path,
                       f"{p.message} (in cell {params_text(cell_params)})")
    for key, value in cell_params.items():
        if p.path == key or p.path.startswith(key + ".") or key.startswith(p.path + "."):
            line, col = src.where(("matrix", key))
            if (line, col) == (0, 0):
                line, col = _zip_where(src, key)
            return Problem(p.file, line, col, p.path,
                           f"{p.message} (matrix value {_as_written(value)})")
    return Problem(p.file, p.line, p.column, p.path,
                   f"{p.message} (in cell {params_text(cell_params)})")


def _as_written(value: object) -> str:
    """A matrix value as YAML spells it (true, not Python's True); others as repr."""
    return ("true" if value else "false") if isinstance(value, bool) else repr(value)


def _zip_where(src: Source, key: str) -> tuple[int, int]:
    for i, group in enumerate((src.data.get("matrix") or {}).get("zip") or []):
        if isinstance(group, dict) and key in group:
            return src.where(("matrix", "zip", i, key))
    return src.where(("matrix",))


def cross_checks(exp: Experiment) -> list[tuple[Loc, str]]:
    """Checks across fields of a valid experiment; returns (loc, message) pairs. Whether the
    placement strategy fits the topology is the planner's check
    (``testbed.plan.placement.capacity_problem``), not this one."""
    w, out = exp.workload, []
    stages = w.parallel.pp * w.chunks
    if w.model.layers % stages:
        what = f"{stages} stages" + (f" (pp={w.parallel.pp} × chunks={w.chunks})" if w.chunks > 1
                                     else "")
        out.append((("workload", "parallel", "pp"),
                    f"{what} do not divide {w.model.layers} layers"))
    if w.schedule_file is None:
        for fld, msg in schedule_problems(w.schedule, w.parallel.pp, w.chunks, w.microbatches):
            out.append((("workload", fld), msg))
    if w.warmup >= w.iterations:
        out.append((("workload", "warmup"), f"warmup={w.warmup} leaves no measured iteration "
                                            f"of iterations={w.iterations}"))
    hosts, per_host = exp.topology.total_hosts, w.ranks_per_host
    if w.world_size > MAX_RANKS:
        out.append((("workload", "parallel"), f"pp × dp = {w.parallel.pp} × {w.parallel.dp} = "
                    f"{w.world_size:,} ranks: at most {MAX_RANKS:,}"))
    elif w.world_size > hosts * per_host:
        out.append((("workload", "parallel"), f"pp × dp = {w.parallel.pp} × {w.parallel.dp} = "
                    f"{w.world_size} ranks do not fit: the topology {exp.topology.name!r} has "
                    f"{hosts} hosts × ranks_per_host={per_host} = {hosts * per_host} ranks"))
    if exp.backend == "remote" and exp.remote is None:
        out.append((("backend",), "backend remote needs a remote section naming the lab's "
                                  "inventory: remote: {inventory: lab.ini}"))
    if exp.backend == "cluster" and exp.cluster is None:
        out.append((("backend",), "backend cluster needs a cluster section naming the machines' "
                                  "inventory: cluster: {inventory: machines.ini}"))
    if exp.cluster is not None:
        dcs = {dc.name for dc in exp.topology.dcs}
        out += [(("cluster", "place", dc), f"no DC {dc!r} in the topology (its DCs: "
                                           f"{', '.join(sorted(dcs))})")
                for dc in exp.cluster.place if dc not in dcs]
    if not isinstance(exp.placement, str):
        out += map_problems(exp.topology, exp.placement.map, w.parallel.pp, w.parallel.dp,
                            per_host)
    return out + _link_checks(exp) + controller_problems(exp)


def controller_problems(exp: Experiment) -> list[tuple[Loc, str]]:
    """What keeps ``controller:`` from driving this experiment's links."""
    c = exp.controller
    if c is None:
        return []
    resolved = exp.topology.resolved_links()
    names = [f"{lk.a}-{lk.b}" for lk in resolved]
    out = [(("controller", "links"), f"no inter-DC link {n!r}: the topology's are "
                                     f"{', '.join(names) or 'none'}")
           for n in c.links or [] if n not in names]
    if not names:
        out.append((("controller",), "the topology has no inter-DC link to drive"))
    if exp.workload.program is not None:
        out.append((("controller",), "the controller reads the built-in worker's waits: remove "
                                     "workload.program or controller"))
    if exp.backend in ("remote", "cluster"):
        out.append((("controller",), "the controller reads every rank's trace while the cell "
                                     "runs, which lab hosts and machines bring back only at its "
                                     "end: use "
                                     "backend netns or mininet"))
    stepped = [f"{lk.a}-{lk.b}" for lk in resolved if lk.steps
               and (c.links is None or f"{lk.a}-{lk.b}" in c.links)]
    if stepped:
        out.append((("controller",), f"links {', '.join(stepped)} have time-varying steps; "
                                     "a controller and steps cannot both set them"))
    return out


SCHEDULE_READERS = {".csv": read_csv, ".py": load_py}


def schedule_file_problems(src: Source, w: Workload) -> list[Problem]:
    """A ``schedule_file`` that is missing, of an unknown kind, or not a complete runnable
    schedule of the workload's shape: problems at their line and column in that file (a .py
    file's function is called with context None here)."""
    path = w.schedule_path
    if path is None:
        return []
    loc = ("workload", "schedule_file")
    reader = SCHEDULE_READERS.get(path.suffix.lower())
    if reader is None:
        return [src.problem(loc, f"{w.schedule_file!r}: a schedule file is a .csv or a .py")]
    if not path.is_file():
        return [src.problem(loc, f"schedule file {w.schedule_file!r} not found next to "
                                 f"{Path(src.file).name}")]
    try:
        reader(path, Shape(w.parallel.pp, w.chunks, w.microbatches, w.memory_limit))
    except ScheduleFileError as e:
        return [Problem(str(path), p.line, p.column, "workload.schedule_file", p.message)
                for p in e.problems]
    return []


def _link_checks(exp: Experiment) -> list[tuple[Loc, str]]:
    """'NxTF' delays that cannot be resolved, and per_link keys naming no inter-DC link."""
    out = []
    for loc, p in exp.link_overrides():
        if p.relative_delay_tf is not None:
            tf = stage_forward_ms(exp.workload)
            out.append((loc + ("delay_ms",), f"{p.delay_ms!r} needs one stage's forward time: "
                        "set workload.compute.forward_ms (or a device)" if tf is None else
                        f"{p.delay_ms!r} is {p.relative_delay_tf * tf:g} ms, above "
                        f"{MAX_DELAY_MS} ms"))
    names = set(exp.topology.link_names())
    for key in exp.links.per_link:
        if key not in names:
            valid = ", ".join(sorted(names)) or "none"
            out.append((("links", "per_link", key), f"no inter-DC link {key!r}; links: {valid}"))
    return out


def _expand(src: Source, topo: Topology | None, problems: list[Problem]) -> list[Cell]:
    """The cells of the file's matrix (one without a matrix), each validated; two cells that
    resolve to the same settings are a problem."""
    matrix = parse_matrix(src, problems)
    if matrix is None or topo is None:
        return []
    cells: list[Cell] = []
    by_id: dict[str, dict] = {}
    for params, data in matrix.documents(src, problems):
        exp = _validate_experiment(src, data, topo, problems, cell_params=params)
        if exp is None:
            continue
        cell = Cell(len(cells), cell_id(exp), params, exp)
        if cell.cell_id in by_id:
            problems.append(src.problem(("matrix",), f"cells {params_text(by_id[cell.cell_id])} "
                                        f"and {params_text(params)} resolve to the same settings"))
            continue
        by_id[cell.cell_id] = params
        cells.append(cell)
    if not cells and not problems:
        problems.append(src.problem(("matrix", "exclude"), "every cell is excluded"))
    return cells
