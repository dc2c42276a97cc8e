"""Matrix expansion and cell ids.

``matrix`` maps dotted paths into the experiment file to lists of values; the cells are their
cartesian product. ``zip`` groups vary together, ``exclude`` drops cells. A cell's id is a hash
of its resolved settings, so the same settings get the same id on any machine.
"""
from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
from dataclasses import dataclass
from typing import Any, Iterator

from pydantic import BaseModel

from testbed.errors import Problem
from testbed.topology import LinkProfile
from testbed.spec.models import Experiment
from testbed.spec.gradsync import GradientSync
from testbed.spec.problems import model_in
from testbed.spec.source import Loc, Source

MATRIX_KEYWORDS = ("zip", "exclude")
# Most cells one file may make. A cell runs for half a minute or more, so 10,000 cells are days
# of runs; validating them all takes about 3 s of CPU here (results/benchmarks/bench_hostile.md). The
# size is the product of the axis lengths, known before expanding.
MAX_CELLS = 10_000

# Fields added after cell ids were first published: hashed only when set, so that adding a
# field does not change the id of every existing cell (and `run --resume` keeps working).
ID_OPTIONAL_FIELDS = {"remote": None, "cluster": None, "topology.tcp_congestion_control": "cubic",
                      "workload.connections": 1, "workload.memory_limit": None,
                      "workload.filler": None, "workload.schedule_file": None,
                      "workload.program": None, "workload.program.start": "fork",
                      "workload.ranks_per_host": 1,
                      "workload.gradient_sync": GradientSync().model_dump(mode="json"),
                      "workload.wan_sharing": "fair", "workload.dist_backend": "auto", "controller": None,
                      "workload.unshaped_rdma": False,
                      **{f"workload.gradient_sync.{k}": v for k, v in GradientSync().model_dump(
                          mode="json").items() if k not in ("algorithm", "overlap", "bucket_mb")}}

# The same, for fields of every DC of the topology.
ID_OPTIONAL_DC_FIELDS = {"intra_host": None}


@dataclass
class Cell:
    """One point of the matrix: the resolved experiment and the values that made it."""

    index: int
    cell_id: str
    params: dict[str, Any]
    experiment: Experiment

    @property
    def label(self) -> str:
        """Short human form of the swept values, e.g. ``delay_ms=10 schedule=1f1b``."""
        return " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in self.params.items()) or "(base)"


def cell_id(exp: Experiment) -> str:
    """A stable id from the resolved settings (and a schedule file's contents): same settings,
    same id, on any machine."""
    resolved = exp.model_dump(mode="json", exclude={"matrix", "repeat", "description"})
    for path, default in ID_OPTIONAL_FIELDS.items():
        *parents, name = path.split(".")
        d = resolved
        for p in parents:
            d = d.get(p) or {}
        if name in d and d[name] == default:
            del d[name]
    for dc in resolved["topology"]["dcs"]:
        for name, default in ID_OPTIONAL_DC_FIELDS.items():
            if dc.get(name, default) == default:
                dc.pop(name, None)
    path = exp.workload.schedule_path
    if path is not None and path.is_file():  # an edited schedule file is another cell
        resolved["workload"]["schedule_file_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    digest = hashlib.sha256(json.dumps(resolved, sort_keys=True).encode()).hexdigest()
    return f"c{digest[:8]}"


def params_text(params: dict) -> str:
    """``path=value, …`` of a cell's swept values, for messages."""
    return ", ".join(f"{k}={v!r}" for k, v in params.items())


@dataclass
class Matrix:
    """A checked ``matrix``: groups of paths whose values vary together, and the excluded
    combinations."""

    groups: list[dict[str, list]]
    excludes: list[dict]

    def documents(self, src: Source, problems: list[Problem]) -> Iterator[tuple[dict, dict]]:
        """(params, document) per cell that is not excluded, in matrix order: the file's data
        with the cell's values set. A swept topology is reported and its cells skipped."""
        for params in _combinations(self.groups):
            if any(all(_same(params.get(k), v) for k, v in ex.items()) for ex in self.excludes):
                continue
            data = _document(src, params, problems)
            if data is not None:
                yield params, data


def parse_matrix(src: Source, problems: list[Problem]) -> Matrix | None:
    """The file's ``matrix``, checked; None (with ``problems`` appended) when it is wrong."""
    matrix = src.data.get("matrix") or {}
    if not isinstance(matrix, dict):
        problems.append(src.problem(("matrix",), "must map dotted paths to lists of values"))
        return None
    axes = _matrix_axes(src, matrix, problems)
    excludes = _matrix_excludes(src, matrix, problems)
    if axes is None or excludes is None:
        return None
    size = math.prod(len(next(iter(g.values()))) for g in axes)
    if size > MAX_CELLS:
        problems.append(src.problem(("matrix",), f"makes {size:,} cells, over the cap of "
                                    f"{MAX_CELLS:,} per file: split the sweep into several files"))
        return None
    return Matrix(axes, excludes)


def _same(a: Any, b: Any) -> bool:
    return a == b and type(a) is type(b) or (isinstance(a, (int, float)) and
                                              isinstance(b, (int, float)) and a == b)


def _matrix_axes(src: Source, matrix: dict, problems: list[Problem]):
    """Axes as a list of groups; each group is {path: values} whose values vary together."""
    groups: list[dict[str, list]] = []
    n_before = len(problems)
    for key, values in matrix.items():
        if key in MATRIX_KEYWORDS:
            continue
        if _check_axis(src, ("matrix", key), key, values, problems):
            groups.append({key: values})
    zips = matrix.get("zip") or []
    if not isinstance(zips, list):
        problems.append(src.problem(("matrix", "zip"), "must be a list of groups {path: [values]}"))
        zips = []
    for i, group in enumerate(zips):
        g = _zip_group(src, i, group, problems)
        if g:
            groups.append(g)
    _check_no_repeats(src, groups, problems)
    return groups if len(problems) == n_before else None


def _zip_group(src: Source, i: int, group: Any, problems: list[Problem]) -> dict | None:
    loc = ("matrix", "zip", i)
    if not isinstance(group, dict) or not group:
        problems.append(src.problem(loc, "a zip group maps paths to equally long lists"))
        return None
    ok = all(_check_axis(src, loc + (k,), k, v, problems) for k, v in group.items())
    lengths = {len(v) for v in group.values() if isinstance(v, list)}
    if ok and len(lengths) > 1:
        problems.append(src.problem(loc, f"zip lists differ in length: {sorted(lengths)}"))
        return None
    return group if ok else None


def _check_axis(src: Source, loc: Loc, key: Any, values: Any, problems: list[Problem]) -> bool:
    if not isinstance(key, str) or not path_exists(key):
        problems.append(src.problem(loc, f"{key!r} is not a field of the experiment file "
                                    "(use a dotted path such as links.inter_dc.delay_ms)"))
        return False
    if key.startswith("matrix") or key in ("name", "repeat"):
        problems.append(src.problem(loc, f"{key!r} cannot be swept"))
        return False
    if not isinstance(values, list) or not values:
        problems.append(src.problem(loc, "must be a non-empty list of values"))
        return False
    return True


def _check_no_repeats(src: Source, groups: list[dict], problems: list[Problem]) -> None:
    seen: set[str] = set()
    for g in groups:
        for k in g:
            if k in seen:
                problems.append(src.problem(("matrix", k), f"{k!r} is swept twice"))
            seen.add(k)


def _matrix_excludes(src: Source, matrix: dict, problems: list[Problem]):
    excludes = matrix.get("exclude") or []
    if not isinstance(excludes, list):
        problems.append(src.problem(("matrix", "exclude"), "must be a list of {path: value}"))
        return None
    swept = {k for k in matrix if k not in MATRIX_KEYWORDS}
    swept |= {k for g in matrix.get("zip") or [] if isinstance(g, dict) for k in g}
    out = []
    for i, ex in enumerate(excludes):
        if not isinstance(ex, dict) or not ex:
            problems.append(src.problem(("matrix", "exclude", i), "must map swept paths to values"))
            continue
        for k in ex:
            if k not in swept:
                problems.append(src.problem(("matrix", "exclude", i, k),
                                            f"{k!r} is not a swept path; swept: "
                                            f"{', '.join(sorted(swept)) or 'none'}"))
        out.append(ex)
    return out


def _combinations(groups: list[dict[str, list]]):
    per_group = [[{k: v[i] for k, v in g.items()} for i in range(len(next(iter(g.values()))))]
                 for g in groups]
    for combo in itertools.product(*per_group):
        params: dict[str, Any] = {}
        for part in combo:
            params.update(part)
        yield params


def path_exists(dotted: str) -> bool:
    """Whether a dotted path names a field of the experiment file (dict-valued fields such as
    ``links.per_link`` accept any key)."""
    cur: Any = Experiment
    for part in dotted.split("."):
        if cur is dict:
            cur = LinkProfile
            continue
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)) or part not in cur.model_fields:
            return False
        ann = cur.model_fields[part].annotation
        cur = dict if getattr(ann, "__origin__", None) is dict and part != "matrix" else model_in(ann)
    return True


def _set_path(data: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    cur = data
    for p in parts[:-1]:
        if not isinstance(cur.get(p), dict):
            cur[p] = {}
        cur = cur[p]
    cur[parts[-1]] = value


def _document(src: Source, params: dict, problems: list[Problem]) -> dict | None:
    """The file's data without ``matrix`` and with the cell's values set; None (reported) when
    the cell sweeps the topology."""
    # the matrix itself is left out before copying: it is the largest part of a big sweep
    data = copy.deepcopy({k: v for k, v in src.data.items() if k != "matrix"})
    for key, value in params.items():
        if key == "topology" or key.startswith("topology."):
            problems.append(src.problem(("matrix", key), "sweep topologies with one experiment "
                                        "file per topology"))
            return None
        _set_path(data, key, value)
    return data
