"""Lowering: add the SEND/RECV actions a schedule needs between ranks, and a timing check.

A RECV is placed just before the compute that consumes it and a SEND just after the compute
that produced it. ``timeline`` runs a schedule's per-rank orders against their dependencies
(F of stage s needs F of s−1; B of s needs B of s+1 and F of s) with given compute times and a
per-boundary latency, and raises ValueError on a deadlock.
"""
from __future__ import annotations

from dataclasses import dataclass

from testbed.schedule.ir import Action, Kind, Schedule


def lower(schedule: Schedule) -> Schedule:
    """A copy of ``schedule`` with SEND_F/RECV_F/SEND_B/RECV_B between ranks."""
    owner, last = schedule.stage_to_rank, schedule.n_stages - 1
    out = []
    for rank, acts in enumerate(schedule.actions):
        lowered: list[Action] = []
        for a in acts:
            if a.kind is Kind.F and a.stage > 0 and owner[a.stage - 1] != rank:
                lowered.append(Action(a.stage, Kind.RECV_F, a.microbatch))
            if a.kind in (Kind.B, Kind.I) and a.stage < last and owner[a.stage + 1] != rank:
                lowered.append(Action(a.stage, Kind.RECV_B, a.microbatch))
            lowered.append(a)
            if a.kind is Kind.F and a.stage < last and owner[a.stage + 1] != rank:
                lowered.append(Action(a.stage, Kind.SEND_F, a.microbatch))
            if a.kind in (Kind.B, Kind.I) and a.stage > 0 and owner[a.stage - 1] != rank:
                lowered.append(Action(a.stage, Kind.SEND_B, a.microbatch))
        out.append(lowered)
    return Schedule(schedule.name, schedule.pp, schedule.n_stages, schedule.microbatches,
                    list(owner), out, schedule.variant)


@dataclass
class Timeline:
    """Start and end (ms) of every compute action, and per-rank busy time."""

    start: dict[Action, float]
    end: dict[Action, float]
    span_ms: float
    busy_ms: list[float]

    @property
    def bubble_ratio(self) -> float:
        """Idle / span, mean over ranks."""
        return sum(1 - b / self.span_ms for b in self.busy_ms) / len(self.busy_ms)


def _deps(a: Action, n_stages: int) -> list[Action]:
    if a.kind is Kind.F:
        return [Action(a.stage - 1, Kind.F, a.microbatch)] if a.stage > 0 else []
    deps = [Action(a.stage, Kind.F, a.microbatch)]
    if a.stage < n_stages - 1:
        deps.append(Action(a.stage + 1, Kind.B, a.microbatch))
    return deps


def timeline(schedule: Schedule, f_ms: float, b_ms: float, link_ms: float = 0.0) -> Timeline:
    """Run the compute actions in each rank's order as early as dependencies allow.

    ``link_ms`` is added to every dependency that crosses ranks. Supports F and B actions.
    Raises ValueError when no rank can make progress (a deadlocked order).
    """
    owner, n = schedule.stage_to_rank, schedule.n_stages
    queues = [[a for a in acts if a.kind in (Kind.F, Kind.B)] for acts in schedule.actions]
    start, end, free = {}, {}, [0.0] * schedule.pp
    pos = [0] * schedule.pp
    while any(pos[r] < len(q) for r, q in enumerate(queues)):
        progressed = False
        for r, q in enumerate(queues):
            while pos[r] < len(q) and all(d in end for d in _deps(q[pos[r]], n)):
                a = q[pos[r]]
                ready = max([free[r]] + [end[d] + (link_ms if owner[d.stage] != r else 0)
                                         for d in _deps(a, n)])
                start[a], end[a] = ready, ready + (f_ms if a.kind is Kind.F else b_ms)
                free[r], pos[r], progressed = end[a], pos[r] + 1, True
        if not progressed:
            stuck = {r: str(q[pos[r]]) for r, q in enumerate(queues) if pos[r] < len(q)}
            raise ValueError(f"deadlock: ranks wait on {stuck}")
    span = max(end.values()) - min(start.values())
    busy = [sum(end[a] - start[a] for a in q) for q in queues]
    return Timeline(start, end, span, busy)
