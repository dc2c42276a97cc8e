"""What a schedule read from a file (``testbed.schedule.csvfile``) must satisfy before it is
used, each problem at its line and column: as many rows as pipeline ranks, every stage run by
one rank, every (stage, microbatch) with its forward and one backward, an order in which no
rank waits forever, and activations within ``memory_limit``.
"""
from __future__ import annotations

from dataclasses import dataclass

from testbed.schedule.ir import Action, Kind, Schedule


@dataclass(frozen=True)
class FileProblem:
    """A problem in a schedule file at ``line``:``column`` (1-based)."""

    line: int
    column: int
    message: str


@dataclass(frozen=True)
class Shape:
    """What the workload asks of the schedule."""

    pp: int
    chunks: int
    microbatches: int
    memory_limit: int | None = None

    @property
    def n_stages(self) -> int:
        return self.pp * self.chunks


# where each action was read: its (line, column), 1-based
Located = dict[Action, tuple[int, int]]


def shape_problems(actions: list[list[Action]], where: Located, shape: Shape,
                    after_last: int) -> list[FileProblem]:
    """Rows ≠ pp, stages ≠ pp × chunks, stages run by two ranks, microbatches out of range,
    and every (stage, microbatch) whose F or backward is missing."""
    if len(actions) != shape.pp:
        line = shape.pp + 1 if len(actions) > shape.pp else after_last
        return [FileProblem(line, 1, f"{len(actions)} rows (ranks), the workload has "
                                     f"pp={shape.pp}")]
    out = []
    for a, (line, col) in where.items():
        if a.stage >= shape.n_stages:
            out.append(FileProblem(line, col, f"{a}: stage {a.stage} out of range; pp={shape.pp}"
                                              f" × chunks={shape.chunks} = {shape.n_stages} "
                                              "stages (0-based)"))
        elif a.microbatch >= shape.microbatches:
            out.append(FileProblem(line, col, f"{a}: microbatch {a.microbatch} out of range; "
                                              f"microbatches={shape.microbatches} (0-based)"))
    out += _ownership_problems(actions, where)
    return out or _missing(actions, where, shape)


def _ownership_problems(actions: list[list[Action]], where: Located) -> list[FileProblem]:
    first: dict[int, int] = {}
    out = []
    for rank, acts in enumerate(actions):
        for a in acts:
            r = first.setdefault(a.stage, rank)
            if r != rank:
                out.append(FileProblem(*where[a], f"{a}: stage {a.stage} is already run by rank "
                                                  f"{r} (row {r + 1}); one rank per stage"))
                first[a.stage] = rank  # report each extra owner once
    return out


def _missing(actions: list[list[Action]], where: Located, shape: Shape) -> list[FileProblem]:
    """Each (stage, microbatch) needs one F and either one B or one I and one W."""
    have = set(where)
    out = []
    stages = {a.stage: r for r, acts in enumerate(actions) for a in acts}
    for s in range(shape.n_stages):
        if s not in stages:
            out.append(FileProblem(1, 1, f"stage {s} appears in no row: pp={shape.pp} × "
                                         f"chunks={shape.chunks} = {shape.n_stages} stages"))
            continue
        for m in range(shape.microbatches):
            need = _needed(have, s, m)
            if need:
                line = stages[s] + 1
                out.append(FileProblem(line, 1, f"rank {stages[s]} (row {line}) lacks "
                                                f"{' and '.join(need)} (stage {s}, "
                                                f"microbatch {m})"))
    return out


def _needed(have: set[Action], s: int, m: int) -> list[str]:
    out = [] if Action(s, Kind.F, m) in have else [str(Action(s, Kind.F, m))]
    full, i, w = (Action(s, k, m) in have for k in (Kind.B, Kind.I, Kind.W))
    if full and (i or w):
        out.append(f"one backward: {Action(s, Kind.B, m)} or {Action(s, Kind.I, m)} + "
                   f"{Action(s, Kind.W, m)}, not both")
    elif not full and not (i and w):
        out.append(f"{Action(s, Kind.B, m)} (or {Action(s, Kind.I, m)} and "
                   f"{Action(s, Kind.W, m)})")
    return out


def owners(actions: list[list[Action]], n_stages: int) -> list[int]:
    owner = [0] * n_stages
    for rank, acts in enumerate(actions):
        for a in acts:
            owner[a.stage] = rank
    return owner


def _deps(a: Action, n_stages: int) -> list:
    """What ``a`` waits for: actions, or ``("grad", s, m)`` = stage s's input gradient of
    microbatch m (its B or its I), which a backward of stage s−1 needs."""
    if a.kind is Kind.F:
        return [Action(a.stage - 1, Kind.F, a.microbatch)] if a.stage > 0 else []
    if a.kind is Kind.W:
        return [Action(a.stage, Kind.I, a.microbatch)]
    deps = [Action(a.stage, Kind.F, a.microbatch)]
    if a.stage < n_stages - 1:
        deps.append(("grad", a.stage + 1, a.microbatch))
    return deps


def deadlock_problems(schedule: Schedule, where: Located) -> list[FileProblem]:
    """Run every rank's order as far as its dependencies allow; each rank left waiting is a
    problem at the action it waits on (empty when the order completes)."""
    done: set = set()
    pos = [0] * schedule.pp
    progressed = True
    while progressed:
        progressed = False
        for r, acts in enumerate(schedule.actions):
            while pos[r] < len(acts) and all(d in done for d in _deps(acts[pos[r]],
                                                                        schedule.n_stages)):
                a = acts[pos[r]]
                done.add(a)
                if a.kind in (Kind.B, Kind.I):
                    done.add(("grad", a.stage, a.microbatch))
                pos[r], progressed = pos[r] + 1, True
    return [FileProblem(*where[acts[pos[r]]], f"deadlock: rank {r} waits forever at "
                                              f"{acts[pos[r]]} (needs "
                                              f"{_need_text(acts[pos[r]], schedule.n_stages)})")
            for r, acts in enumerate(schedule.actions) if pos[r] < len(acts)]


def _need_text(a: Action, n: int) -> str:
    return ", ".join(str(d) if isinstance(d, Action) else f"{d[1]}B{d[2]}/{d[1]}I{d[2]}"
                     for d in _deps(a, n))


def memory_problems(schedule: Schedule, where: Located,
                    memory_limit: int | None) -> list[FileProblem]:
    """Activations held per stage (F to its last backward action, as the simulator counts) in
    each rank's order; the first F over ``memory_limit`` is a problem."""
    if memory_limit is None:
        return []
    release = {(a.stage, a.microbatch): a.kind for acts in schedule.actions for a in acts
               if a.kind in (Kind.B, Kind.W)}
    for acts in schedule.actions:
        live: dict[int, int] = {}
        for a in acts:
            if a.kind is Kind.F:
                live[a.stage] = live.get(a.stage, 0) + 1
                if live[a.stage] > memory_limit:
                    return [FileProblem(*where[a], f"{a}: stage {a.stage} holds "
                                                   f"{live[a.stage]} microbatches of activations, "
                                                   f"over memory_limit={memory_limit}")]
            elif release.get((a.stage, a.microbatch)) is a.kind:
                live[a.stage] -= 1
    return []
