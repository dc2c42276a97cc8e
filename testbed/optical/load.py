"""Reading optical experiment, blocking and network files: every problem at its line and
column, all at once (``SpecError``, exit 2), the same way as experiment files."""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ValidationError

from testbed.errors import Problem, SpecError
from testbed.optical.network import OpticalNetwork
from testbed.optical.nsfnet import BUILT_IN, built_in
from testbed.optical.plugins import is_file_policy, policy_class
from testbed.optical.policy import BUILT_IN as BUILT_IN_POLICIES
from testbed.optical.routes import Router
from testbed.optical.spec import BlockingRun, NetworkSpec, OpticalExperiment
from testbed.spec.problems import pydantic_problems
from testbed.spec.source import Source, read_source


@dataclass
class LoadedOptical:
    """A checked optical experiment: the file's model, its network and the stages' DCs."""

    path: Path
    exp: OpticalExperiment
    net: OpticalNetwork
    stage_dcs: list[str]


def _validate(src: Source, model: type[BaseModel], data) -> BaseModel:
    if not isinstance(data, dict):
        raise SpecError([Problem(src.file, 1, 1, "", "the file must be a mapping")])
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise SpecError(pydantic_problems(e, src, (), model)) from None


def _network(src: Source, spec: NetworkSpec) -> OpticalNetwork:
    where = ("network",)
    try:
        if spec.use is None:
            base = {"nodes": spec.nodes, "links": [lk.model_dump() for lk in spec.links]}
        elif spec.use in BUILT_IN:
            base = built_in(spec.use).model_dump(exclude={"dcs", "domains"})
        else:
            file = Path(src.file).parent / spec.use
            net_src = read_source(file)
            net = _validate(net_src, OpticalNetwork, net_src.data)
            base = net.model_dump()
        return OpticalNetwork.model_validate({**base, **spec.overrides()})
    except ValidationError as e:
        raise SpecError([src.problem(where, f"{err['msg'].removeprefix('Value error, ')}")
                         for err in e.errors()]) from None


def _policy_problems(src: Source, names: list[str], loc: tuple) -> list[Problem]:
    out = []
    for i, name in enumerate(names):
        try:
            if is_file_policy(name):
                policy_class(name, Path(src.file).parent)
            elif name not in BUILT_IN_POLICIES:
                raise ValueError(f"unknown policy {name!r}; built in: "
                                 f"{', '.join(BUILT_IN_POLICIES)}, or a path to a .py file")
        except ValueError as e:
            out.append(src.problem(loc + (i,), str(e)))
    return out


def _placement(exp: OpticalExperiment, net: OpticalNetwork) -> list[str]:
    if exp.job.placement != "random":
        return list(exp.job.placement)
    rng = random.Random(exp.job.placement_seed)
    return [rng.choice(sorted(net.dcs)) for _ in range(exp.job.stages)]


def _job_problems(src: Source, exp: OpticalExperiment, net: OpticalNetwork) -> list[Problem]:
    out, job = [], exp.job
    if not net.dcs:
        out.append(src.problem(("network",), "no DCs: give network.dcs (DC name → node)"))
    if job.placement != "random":
        if len(job.placement) != job.stages:
            out.append(src.problem(("job", "placement"), f"{len(job.placement)} DCs for "
                                                         f"{job.stages} stages"))
        for i, dc in enumerate(job.placement):
            if dc not in net.dcs:
                out.append(src.problem(("job", "placement", i), f"unknown DC {dc!r}; DCs: "
                                                                f"{', '.join(net.dcs)}"))
    usable = net.slots - net.guard_slots
    if job.slots.high > usable:
        out.append(src.problem(("job", "slots", "high"), f"more than the {usable} slots a "
                                                         "lightpath can have on this grid"))
    bg = exp.background
    if bg.kind != "none" and bg.slots[1] > usable:
        out.append(src.problem(("background", "slots"), f"more than the {usable} slots a "
                                                        "lightpath can have on this grid"))
    return out


def _connected(src: Source, net: OpticalNetwork, nodes: list[str], loc: tuple) -> list[Problem]:
    router = Router(net, 1)
    lonely = [n for n in nodes if n != nodes[0] and not router.routes(nodes[0], n)]
    return [src.problem(loc, f"no fiber path from {nodes[0]} to {', '.join(lonely)}")] if lonely \
        else []


def load_optical(path: Path) -> LoadedOptical:
    """Load and check an optical experiment file; raises SpecError with every problem."""
    src = read_source(Path(path))
    exp = _validate(src, OpticalExperiment, src.data)
    net = _network(src, exp.network)
    problems = _job_problems(src, exp, net)
    problems += _policy_problems(src, exp.sweep.policy, ("sweep", "policy"))
    if not problems:
        problems += _connected(src, net, net.node_names, ("network",))
    if problems:
        raise SpecError(problems)
    return LoadedOptical(Path(path), exp, net, _placement(exp, net))


def load_blocking(path: Path) -> tuple[BlockingRun, OpticalNetwork]:
    """Load and check a blocking file; raises SpecError with every problem."""
    src = read_source(Path(path))
    run = _validate(src, BlockingRun, src.data)
    net = _network(src, run.network)
    problems = _policy_problems(src, [run.policy], ("policy",))
    known = set(net.node_names)
    for i, req in enumerate(run.requests or []):
        for end in ("src", "dst"):
            if getattr(req, end) not in known:
                problems.append(src.problem(("requests", i, end), f"unknown node "
                                                                  f"{getattr(req, end)!r}"))
        if req.src == req.dst:
            problems.append(src.problem(("requests", i), "src and dst are the same node"))
        if req.slots + net.guard_slots > net.slots:
            problems.append(src.problem(("requests", i, "slots"), "wider than the grid"))
    if run.poisson is not None and run.poisson.slots[1] + net.guard_slots > net.slots:
        problems.append(src.problem(("poisson", "slots"), "wider than the grid"))
    if not problems:
        problems += _connected(src, net, net.node_names, ("network",))
    if problems:
        raise SpecError(problems)
    return run, net
