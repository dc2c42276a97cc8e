"""The experiment file: typed models, loading with file:line:column errors, matrix expansion.

Nothing here touches the kernel or imports torch: ``validate``, ``plan`` and ``schema`` run
without root in well under a second.

An experiment file is YAML with the fields of :class:`Experiment`. ``topology`` is a path
(relative to the experiment file, then to the current directory, then to the project) or an
inline mapping with the fields of :class:`testbed.net.topology.Topology`. ``matrix`` maps dotted
paths into the file to lists of values; ``zip`` groups vary together, ``exclude`` drops cells.
"""
from __future__ import annotations

import copy
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from testbed.errors import Problem, SpecError
from testbed.net.topology import MAX_DELAY_MS, LinkProfile, Step, Strict, Topology
from testbed.schedule.registry import CROSS_DC_SCHEDULES, SCHEDULES, schedule_problems

PROJECT_ROOT = Path(__file__).resolve().parents[1]
MATRIX_KEYWORDS = ("zip", "exclude")
STRATEGIES = ("in_order", "atlas", "cba")  # placement strategies (testbed.placement)
Loc = tuple[Any, ...]


# ---------------------------------------------------------------- models


class ModelSpec(Strict):
    """A GPT-style decoder's size."""

    layers: int = Field(8, ge=1, le=1024)
    hidden: int = Field(1024, ge=8, le=65536)
    heads: int = Field(16, ge=1, le=1024)
    seq_len: int = Field(1024, ge=1, le=1_048_576)
    vocab: int = Field(32000, ge=2, le=1_048_576)

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> "ModelSpec":
        if self.hidden % self.heads:
            raise ValueError(f"heads={self.heads} must divide hidden={self.hidden}")
        return self


class Parallel(Strict):
    """Pipeline stages (pp) × data-parallel replicas (dp); one rank per host."""

    pp: int = Field(4, ge=1, le=128)
    dp: int = Field(1, ge=1, le=128)


class Compute(Strict):
    """Real forward/backward, or emulated: each F/B/W takes a modelled time (per virtual stage,
    per microbatch) while tensors of the true shapes cross the network."""

    mode: Literal["emulated", "real"] = "emulated"
    forward_ms: float | None = Field(None, gt=0, le=600_000)
    backward_ms: float | None = Field(None, gt=0, le=600_000, description="full backward B")
    weight_ms: float | None = Field(None, gt=0, le=600_000,
                                    description="W part of B for split schedules (default B/2)")
    device: Literal["a100", "h100"] | None = Field(
        None, description="emulated times from FLOPs / (peak × mfu) instead of forward_ms")
    mfu: float = Field(0.4, gt=0, le=1)
    bytes_scale: float = Field(1.0, gt=0, le=1,
                               description="shrink activation and gradient tensors by this "
                                           "factor; link rates are not changed: give them as "
                                           "real rate × bytes_scale to keep serialization times")
    dtype: Literal["float32", "bfloat16"] = "float32"

    @model_validator(mode="after")
    def _times_known(self) -> "Compute":
        if self.mode == "emulated" and self.device is None and (
                self.forward_ms is None or self.backward_ms is None):
            raise ValueError("emulated compute needs forward_ms and backward_ms, or a device")
        if self.weight_ms is not None and self.backward_ms is not None \
                and self.weight_ms >= self.backward_ms:
            raise ValueError(f"weight_ms={self.weight_ms} must be below backward_ms="
                             f"{self.backward_ms} (W is part of B)")
        return self


class Filler(Strict):
    """Bubble filling (BubbleTea-style): prefill requests of a small inference model, run by each
    rank only inside idle gaps it measured at the same wait in the previous iteration."""

    model: ModelSpec = Field(default_factory=lambda: ModelSpec(layers=2, hidden=256, heads=4,
                                                               seq_len=128, vocab=1000))
    prompt_tokens: int = Field(128, ge=1, le=1_048_576, description="tokens per prefill request")
    mode: Literal["emulated", "real"] | None = Field(
        None, description="real: a torch.no_grad() forward of the model; emulated: sleep "
                          "prefill_ms; default: as workload.compute.mode")
    prefill_ms: float = Field(5.0, gt=0, le=600_000,
                              description="modelled time of one prefill request (emulated mode)")
    margin_ms: float = Field(2.0, ge=0, le=600_000,
                             description="safety margin: a request starts only if it is expected "
                                         "to end this long before the predicted end of the gap")

    @model_validator(mode="after")
    def _prompt_fits(self) -> "Filler":
        if self.prompt_tokens > self.model.seq_len:
            raise ValueError(f"prompt_tokens={self.prompt_tokens} exceeds the filler model's "
                             f"seq_len={self.model.seq_len}: lower it or raise model.seq_len")
        return self


class Workload(Strict):
    """The training job run in every cell."""

    model: ModelSpec = Field(default_factory=ModelSpec)
    parallel: Parallel = Field(default_factory=Parallel)
    schedule: str = Field("1f1b", description="one of: " + ", ".join(
        [*SCHEDULES, *CROSS_DC_SCHEDULES]))
    chunks: int = Field(1, ge=1, le=16, description="virtual stages per rank")
    microbatches: int = Field(8, ge=1, le=4096)
    microbatch_size: int = Field(1, ge=1, le=4096)
    executor: Literal["ir", "torch"] = "ir"
    connections: int = Field(1, ge=1, le=64,
                             description="TCP connections per P2P transfer (ir executor): each "
                                         "activation/gradient is split over this many, as Atlas "
                                         "does on window-limited high-RTT links")
    compute: Compute = Field(default_factory=lambda: Compute(forward_ms=20, backward_ms=40))
    memory_limit: int | None = Field(
        None, ge=1, le=4096, description="most microbatches of activations a stage may hold; "
                                         "the cross-DC schedules (geopipe, crosspipe_*) are "
                                         "built within it (None: no limit)")
    filler: Filler | None = Field(None, description="optional inference prefill run only inside "
                                                    "measured idle gaps (ir executor)")
    iterations: int = Field(6, ge=1, le=100_000, description="total, warm-up included")
    warmup: int = Field(1, ge=0)
    seed: int = 0
    lr: float = Field(1e-3, gt=0)

    @property
    def world_size(self) -> int:
        return self.parallel.pp * self.parallel.dp

    @model_validator(mode="after")
    def _options_need_ir(self) -> "Workload":
        if self.schedule in CROSS_DC_SCHEDULES and self.executor != "ir":
            raise ValueError(f"{self.schedule} needs executor: ir (torch's schedule classes "
                             "have no cross-DC-aware schedules)")
        if self.connections > 1 and self.executor != "ir":
            raise ValueError(f"connections={self.connections} needs executor: ir (the torch "
                             "executor sends each tensor on one connection)")
        if self.filler is not None and self.executor != "ir":
            raise ValueError("filler needs executor: ir (the torch executor's waits are inside "
                             "torch.distributed.pipelining, out of the filler's reach): set "
                             "executor: ir or remove filler")
        return self

    @property
    def filler_mode(self) -> str | None:
        """How the filler runs: its own mode, else the training compute's; None without one."""
        if self.filler is None:
            return None
        return self.filler.mode or self.compute.mode


class LinkOverrides(Strict):
    """Overrides on top of the topology's link profiles (only the fields given change)."""

    inter_dc: LinkProfile | None = Field(None, description="every inter-DC link")
    intra_dc: LinkProfile | None = Field(None, description="every host ↔ DC bridge link")
    per_link: dict[str, LinkProfile] = Field(default_factory=dict,
                                             description='one inter-DC link, keyed "dcA-dcB"')


class Remote(Strict):
    """Lab hosts for ``backend: remote`` (see README, "Real lab clusters")."""

    inventory: str = Field(description="Ansible INI inventory, one group per DC (path relative "
                                       "to this file)")
    known_hosts: str = Field("~/.ssh/known_hosts",
                             description="host keys are checked against this file")
    workdir: str = Field("/tmp", pattern=r"^/", description="absolute directory on each host "
                                                             "for a run's files")
    connect_timeout_s: float = Field(10, gt=0, le=300)
    clock_samples: int = Field(9, ge=1, le=1000,
                               description="round trips per host; the fastest gives the offset")


def stage_forward_ms(w: Workload) -> float | None:
    """One stage's forward time per microbatch in ms, the TF of delays such as '2xTF':
    ``forward_ms``, or virtual stage 0's FLOPs / (peak × mfu) on the device; None when unknown."""
    c = w.compute
    if c.forward_ms is not None:
        return c.forward_ms
    if c.device is None:
        return None
    from testbed.train import model as M  # imports torch: only for device-derived times

    if c.device not in M.PEAK_FLOPS:
        return None
    flops = M.forward_flops(w.model, 0, w.parallel.pp * w.chunks, w.microbatch_size)
    return flops / (M.PEAK_FLOPS[c.device] * c.mfu) * 1000


class Experiment(Strict):
    """One experiment file. ``matrix`` is expanded into cells; each cell is this file with the
    cell's values set at their dotted paths."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    description: str = ""
    backend: Literal["netns", "mininet", "remote"] = "netns"
    shaper: Literal["auto", "netem", "delayline"] = "auto"
    topology: Topology
    links: LinkOverrides = Field(default_factory=LinkOverrides)
    workload: Workload = Field(default_factory=Workload)
    placement: Literal[STRATEGIES] = Field(
        "in_order", description="stage → DC assignment: in_order (contiguous blocks in file "
                                "order), atlas (fewest DCs, cheapest chain), cba (ILP over "
                                "heterogeneous links, re-ranked by the simulator)")
    matrix: dict[str, Any] = Field(default_factory=dict)
    repeat: int = Field(1, ge=1, le=1000)
    timeout_s: float = Field(600, gt=0, description="per cell; workers are killed after it")
    measure_links: bool = Field(True, description="measure RTT and rate of every inter-DC link")
    remote: Remote | None = Field(None, description="lab hosts, for backend: remote")

    def network_topology(self) -> Topology:
        """The topology as built: ``links.intra_dc`` laid over every DC's host-link profile
        (inter-DC overrides apply through ``Topology.resolved_links``)."""
        over = self.links.intra_dc
        if over is None:
            return self.topology
        dcs = [dc.model_copy(update={"intra": dc.intra.merged(over)}) for dc in self.topology.dcs]
        return self.topology.model_copy(update={"dcs": dcs})

    def link_overrides(self) -> list[tuple[Loc, LinkProfile]]:
        """The profiles of ``links`` that are given, with their place in the file."""
        lk = self.links
        out = [(("links", k), p) for k, p in (("inter_dc", lk.inter_dc), ("intra_dc", lk.intra_dc))
               if p is not None]
        return out + [(("links", "per_link", k), p) for k, p in lk.per_link.items()]

    @model_validator(mode="after")
    def _resolve_relative_delays(self) -> "Experiment":
        # '2xTF' → 2 × one stage's forward time, per cell; what cannot be resolved stays and
        # cross_checks reports it
        for _, p in self.link_overrides():
            tf = stage_forward_ms(self.workload) if p.relative_delay_tf is not None else None
            if tf is not None and p.relative_delay_tf * tf <= MAX_DELAY_MS:
                p.delay_ms = p.relative_delay_tf * tf
        return self


# ---------------------------------------------------------------- positioned YAML


@dataclass
class Source:
    """A parsed YAML file: its data and the 1-based (line, column) of every key and item."""

    file: str
    data: Any
    positions: dict[Loc, tuple[int, int]] = field(default_factory=dict)

    def where(self, loc: Loc) -> tuple[int, int]:
        """Position of ``loc``, or of its nearest ancestor that has one (0, 0 if none)."""
        loc = tuple(loc)
        while loc and loc not in self.positions:
            loc = loc[:-1]
        return self.positions.get(loc, (0, 0))

    def problem(self, loc: Loc, message: str) -> Problem:
        line, col = self.where(loc)
        return Problem(self.file, line, col, _dotted(loc), message)


def _dotted(loc: Loc) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in loc).replace(".[", "[")


def parse_yaml(text: str, file: str) -> Source:
    """Parse YAML text, recording positions; raises SpecError on syntax errors or duplicate keys."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        msg = getattr(e, "problem", None) or str(e)
        raise SpecError([Problem(file, line, col, "", f"YAML syntax: {msg}")]) from None
    src = Source(file, data)
    dupes: list[Problem] = []
    if node is not None:
        _walk(node, (), src, dupes)
    if dupes:
        raise SpecError(dupes)
    return src


def _walk(node: yaml.Node, loc: Loc, src: Source, dupes: list[Problem]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = yaml.safe_load(yaml.serialize(key_node)) if key_node.tag != \
                "tag:yaml.org,2002:str" else key_node.value
            child = loc + (key,)
            pos = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            if key in seen:
                dupes.append(Problem(src.file, *pos, _dotted(child), "key given twice"))
            seen.add(key)
            src.positions[child] = pos
            _walk(value_node, child, src, dupes)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            src.positions[loc + (i,)] = (item.start_mark.line + 1, item.start_mark.column + 1)
            _walk(item, loc + (i,), src, dupes)


def read_source(path: Path) -> Source:
    """Read and parse a YAML file; raises SpecError when it is missing or unreadable."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError([Problem(str(path), 0, 0, "", f"cannot read: {e.strerror}")]) from None
    return parse_yaml(text, str(path))


# ---------------------------------------------------------------- validation helpers


def _pydantic_problems(err: ValidationError, src: Source, prefix: Loc,
                       model: type[BaseModel]) -> list[Problem]:
    out = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not _is_union_tag(p))
        out.extend(src.problem(prefix + loc, m) for m in _messages(e, loc, model))
    return out


def _is_union_tag(part: Any) -> bool:
    # pydantic names union members in locs ("str", "Topology", "function-after[...]").
    return isinstance(part, str) and (part[:1].isupper() or "[" in part)


def _messages(e: dict, loc: Loc, model: type[BaseModel]) -> list[str]:
    hint = _description(model, loc)
    return [m + (f" ({hint})" if hint and e["type"] not in ("extra_forbidden", "missing") else "")
            for m in _base_messages(e, loc, model)]


def _description(model: type[BaseModel], loc: Loc) -> str:
    if not loc or isinstance(loc[-1], int):
        return ""
    parent = _model_at(model, loc[:-1])
    f = parent.model_fields.get(loc[-1]) if parent else None
    return (f.description or "") if f else ""


def _base_messages(e: dict, loc: Loc, model: type[BaseModel]) -> list[str]:
    kind, msg = e["type"], e["msg"]
    if kind == "extra_forbidden":
        allowed = _fields_at(model, loc[:-1])
        return [f"unknown key {loc[-1]!r}" + (f"; allowed: {', '.join(allowed)}" if allowed else "")]
    if kind == "missing":
        return ["required; add it"]
    if kind == "value_error":
        msg = msg.removeprefix("Value error, ")
        return msg.split("; ")
    got = e.get("input")
    if isinstance(got, (int, float, str, bool)) and kind not in ("string_pattern_mismatch",):
        return [f"{msg[0].lower()}{msg[1:]} (got {got!r})"]
    return [msg[0].lower() + msg[1:]]


def _model_at(model: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The pydantic model class found by following ``loc`` through field annotations."""
    cur: Any = model
    for part in loc:
        if isinstance(part, int) or cur is None:
            continue
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)):
            return None
        f = cur.model_fields.get(part)
        cur = _model_in(f.annotation) if f else None
    return cur if isinstance(cur, type) and issubclass(cur, BaseModel) else None


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _fields_at(model: type[BaseModel], loc: Loc) -> list[str]:
    m = _model_at(model, loc)
    return list(m.model_fields) if m else []


# ---------------------------------------------------------------- topology


def load_topology(path: Path) -> Topology:
    """Load and validate a topology file; raises SpecError listing every problem."""
    src = read_source(Path(path))
    return _validate_topology(src, ())


def _validate_topology(src: Source, prefix: Loc) -> Topology:
    data = src.data
    for p in prefix:
        data = data[p]
    if not isinstance(data, dict):
        raise SpecError([src.problem(prefix, "a topology must be a mapping (DCs, links)")])
    try:
        topo = Topology.model_validate(data, context={"defer_checks": True})
    except ValidationError as e:
        raise SpecError(_pydantic_problems(e, src, prefix, Topology)) from None
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
            link.steps = sorted(link.steps + steps_from_csv(path), key=lambda st: st.at_s)
        except (OSError, ValueError) as e:
            problems.append(src.problem(loc, f"trace {link.trace_csv}: {e}"))
    return problems


def steps_from_csv(path: Path) -> list[Step]:
    """Read a link trace: a CSV whose header has ``at_s`` and LinkProfile fields (delay_ms,
    rate_mbit, loss_pct, jitter_ms, …); empty cells leave a field unchanged. Raises ValueError
    naming the row that is wrong."""
    import csv

    steps = []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or "at_s" not in reader.fieldnames:
            raise ValueError("needs a header row with an at_s column")
        for n, row in enumerate(reader, start=2):
            values = {k.strip(): v.strip() for k, v in row.items() if k and v and v.strip()}
            try:
                steps.append(Step(**values))
            except ValidationError as e:
                first = e.errors()[0]
                field_name = ".".join(str(x) for x in first["loc"])
                raise ValueError(f"row {n}, {field_name}: {first['msg']}") from None
    return steps


def resolve_topology_path(ref: str, experiment_file: Path) -> Path | None:
    """Find a topology file: next to the experiment, in the current directory, in the project."""
    for base in (experiment_file.parent, Path.cwd(), PROJECT_ROOT):
        candidate = (base / ref).resolve()
        if candidate.is_file():
            return candidate
    return None


# ---------------------------------------------------------------- experiment


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


@dataclass
class LoadedExperiment:
    """A validated experiment file and its cells."""

    path: Path
    experiment: Experiment
    topology_file: Path | None
    cells: list[Cell]
    raw: dict


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
    topo, topo_file = _experiment_topology(src, path, problems)
    base = _validate_experiment(src, src.data, topo, problems, cell_params=None)
    cells = _expand(src, topo, problems) if base is not None else []
    if problems:
        raise SpecError(_unique(problems))
    assert base is not None
    return LoadedExperiment(path, base, topo_file, cells, src.data)


def _unique(problems: list[Problem]) -> list[Problem]:
    seen, out = set(), []
    for p in problems:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return sorted(out, key=lambda p: (p.file != out[0].file, p.line, p.column))


def _experiment_topology(src: Source, path: Path, problems: list[Problem]):
    ref = src.data.get("topology")
    if ref is None:
        problems.append(Problem(str(path), 1, 1, "topology",
                                "required; a topology file path or an inline mapping"))
        return None, None
    try:
        if isinstance(ref, str):
            found = resolve_topology_path(ref, path)
            if found is None:
                problems.append(src.problem(("topology",), f"topology file {ref!r} not found "
                                            f"(looked next to {path.name}, in the current "
                                            "directory and in the project)"))
                return None, None
            return load_topology(found), found
        return _validate_topology(src, ("topology",)), None
    except SpecError as e:
        problems.extend(e.problems)
        return None, None


def _validate_experiment(src: Source, data: dict, topo: Topology | None,
                         problems: list[Problem], cell_params: dict | None) -> Experiment | None:
    """Validate one (possibly matrix-modified) document. Problems in a cell point at the
    matrix entry that set the offending value, when one did."""
    data = dict(data, topology=topo if topo is not None else _PLACEHOLDER_TOPOLOGY)
    found: list[Problem] = []
    try:
        exp = Experiment.model_validate(data)
    except ValidationError as e:
        found = _pydantic_problems(e, src, (), Experiment)
        exp = None
    if exp is not None and topo is not None:
        found += [src.problem(loc, msg) for loc, msg in cross_checks(exp)]
    problems.extend(_in_cell(p, src, cell_params) for p in found)
    return exp if not found else None


_PLACEHOLDER_TOPOLOGY = Topology(name="placeholder", dcs=[{"name": "dc", "hosts": 64}])


def _in_cell(p: Problem, src: Source, cell_params: dict | None) -> Problem:
    if not cell_params:
        return p
    for key, value in cell_params.items():
        if p.path == key or p.path.startswith(key + ".") or key.startswith(p.path + "."):
            line, col = src.where(("matrix", key))
            if (line, col) == (0, 0):
                line, col = _zip_where(src, key)
            return Problem(p.file, line, col, p.path, f"{p.message} (matrix value {value!r})")
    return Problem(p.file, p.line, p.column, p.path,
                   f"{p.message} (in cell {_params_text(cell_params)})")


def _zip_where(src: Source, key: str) -> tuple[int, int]:
    for i, group in enumerate((src.data.get("matrix") or {}).get("zip") or []):
        if isinstance(group, dict) and key in group:
            return src.where(("matrix", "zip", i, key))
    return src.where(("matrix",))


def _params_text(params: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items())


def cross_checks(exp: Experiment) -> list[tuple[Loc, str]]:
    """Checks across fields of a valid experiment; returns (loc, message) pairs."""
    w, out = exp.workload, []
    stages = w.parallel.pp * w.chunks
    if w.model.layers % stages:
        what = f"{stages} stages" + (f" (pp={w.parallel.pp} × chunks={w.chunks})" if w.chunks > 1
                                     else "")
        out.append((("workload", "parallel", "pp"),
                    f"{what} do not divide {w.model.layers} layers"))
    for fld, msg in schedule_problems(w.schedule, w.parallel.pp, w.chunks, w.microbatches):
        out.append((("workload", fld), msg))
    if w.warmup >= w.iterations:
        out.append((("workload", "warmup"), f"warmup={w.warmup} leaves no measured iteration "
                                            f"of iterations={w.iterations}"))
    hosts = exp.topology.total_hosts
    if w.world_size > hosts:
        out.append((("workload", "parallel"), f"pp × dp = {w.parallel.pp} × {w.parallel.dp} = "
                    f"{w.world_size} ranks need {w.world_size} hosts; the topology "
                    f"{exp.topology.name!r} has {hosts}"))
    if exp.backend == "remote" and exp.remote is None:
        out.append((("backend",), "backend remote needs a remote section naming the lab's "
                                  "inventory: remote: {inventory: lab.ini}"))
    for loc, p in exp.link_overrides():
        if p.relative_delay_tf is not None:
            tf = stage_forward_ms(w)
            out.append((loc + ("delay_ms",), f"{p.delay_ms!r} needs one stage's forward time: "
                        "set workload.compute.forward_ms (or a device)" if tf is None else
                        f"{p.delay_ms!r} is {p.relative_delay_tf * tf:g} ms, above "
                        f"{MAX_DELAY_MS} ms"))
    names = {f"{lk.a}-{lk.b}" for lk in exp.topology.resolved_links()}
    for key in exp.links.per_link:
        if key not in names:
            valid = ", ".join(sorted(names)) or "none"
            out.append((("links", "per_link", key), f"no inter-DC link {key!r}; links: {valid}"))
    return out


# ---------------------------------------------------------------- matrix


def _expand(src: Source, topo: Topology | None, problems: list[Problem]) -> list[Cell]:
    matrix = src.data.get("matrix") or {}
    if not isinstance(matrix, dict):
        problems.append(src.problem(("matrix",), "must map dotted paths to lists of values"))
        return []
    axes = _matrix_axes(src, matrix, problems)
    excludes = _matrix_excludes(src, matrix, problems)
    if axes is None or excludes is None or topo is None:
        return []
    cells, by_id = [], {}
    for params in _combinations(axes):
        if any(all(_same(params.get(k), v) for k, v in ex.items()) for ex in excludes):
            continue
        cell = _make_cell(src, topo, params, len(cells), problems)
        if cell is None:
            continue
        if cell.cell_id in by_id:
            problems.append(src.problem(("matrix",), f"cells {_params_text(by_id[cell.cell_id])} "
                                        f"and {_params_text(params)} resolve to the same settings"))
            continue
        by_id[cell.cell_id] = params
        cells.append(cell)
    if not cells and not problems:
        problems.append(src.problem(("matrix", "exclude"), "every cell is excluded"))
    return cells


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
        cur = dict if getattr(ann, "__origin__", None) is dict and part != "matrix" else _model_in(ann)
    return True


def _set_path(data: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    cur = data
    for p in parts[:-1]:
        if not isinstance(cur.get(p), dict):
            cur[p] = {}
        cur = cur[p]
    cur[parts[-1]] = value


def _make_cell(src: Source, topo: Topology, params: dict, index: int,
               problems: list[Problem]) -> Cell | None:
    data = copy.deepcopy(src.data)
    data.pop("matrix", None)
    cell_topo = topo
    for key, value in params.items():
        if key == "topology" or key.startswith("topology."):
            problems.append(src.problem(("matrix", key), "sweep topologies with one experiment "
                                        "file per topology"))
            return None
        _set_path(data, key, value)
    exp = _validate_experiment(src, data, cell_topo, problems, cell_params=params)
    if exp is None:
        return None
    return Cell(index, cell_id(exp), params, exp)


# Fields added after cell ids were first published: hashed only when set, so that adding a
# field does not change the id of every existing cell (and `run --resume` keeps working).
ID_OPTIONAL_FIELDS = {"remote": None, "topology.tcp_congestion_control": "cubic",
                      "workload.connections": 1, "workload.memory_limit": None,
                      "workload.filler": None}


def cell_id(exp: Experiment) -> str:
    """A stable id from the resolved settings: same settings, same id, on any machine."""
    resolved = exp.model_dump(mode="json", exclude={"matrix", "repeat", "description"})
    for path, default in ID_OPTIONAL_FIELDS.items():
        *parents, name = path.split(".")
        d = resolved
        for p in parents:
            d = d.get(p) or {}
        if name in d and d[name] == default:
            del d[name]
    digest = hashlib.sha256(json.dumps(resolved, sort_keys=True).encode()).hexdigest()
    return f"c{digest[:8]}"


def json_schema() -> dict:
    """The JSON Schema of the experiment file (for editors: yaml-language-server)."""
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
