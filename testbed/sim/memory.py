"""Activations held per (rank, virtual stage), counted as the engine runs: one per microbatch
from the end of its F to the end of its last backward action (W when the schedule splits the
backward, else B).

A rank's compute actions end one after another, strictly later each time (every one takes
at least the sleep's overshoot), so counting each rank's changes in the order its actions
run gives the same peaks as sorting every change of the iteration by time.
"""
from __future__ import annotations

from testbed.schedule.ir import Action, Kind, Schedule


class ActivationCount:
    """Live and peak activations per rank and per (rank, own stage); ``hold`` records one
    change of rank ``r``'s count, in the order of its actions."""

    def __init__(self, s: Schedule, world: int):
        self.n_stages, self.pp, self.world = s.n_stages, s.pp, world
        self.release = {(a.stage, a.microbatch): a.kind for acts in s.actions for a in acts
                        if a.kind in (Kind.B, Kind.W)}
        self.own_stages = [s.stages_of(p) for p in range(s.pp)]
        self.slot_of = {st: j for stages in self.own_stages for j, st in enumerate(stages)}
        self.width = max(map(len, self.own_stages), default=0) or 1
        self.live_rank, self.peak_rank = [0] * world, [0] * world
        self.live_stage, self.peak_stage = [0] * (world * self.width), [0] * (world * self.width)

    def delta(self, a: Action) -> int:
        """+1 when ``a`` holds a microbatch's activations from its end, −1 when it frees them."""
        if a.kind is Kind.F:
            return 1
        return -1 if self.release.get((a.stage, a.microbatch)) is a.kind else 0

    def hold(self, r: int, slot: int, delta: int) -> None:
        """Rank ``r``'s count of its stage at ``slot`` (its index among the rank's stages)
        changes by ``delta``."""
        j = r * self.width + slot
        live = self.live_stage[j] = self.live_stage[j] + delta
        if live > self.peak_stage[j]:
            self.peak_stage[j] = live
        live = self.live_rank[r] = self.live_rank[r] + delta
        if live > self.peak_rank[r]:
            self.peak_rank[r] = live

    def peak_per_stage(self) -> list[int]:
        """Most microbatches in flight on each virtual stage (worst data-parallel replica)."""
        out = [0] * self.n_stages
        for r in range(self.world):
            for j, st in enumerate(self.own_stages[r % self.pp]):
                out[st] = max(out[st], self.peak_stage[r * self.width + j])
        return out

    def peak_per_rank(self) -> list[int]:
        """Most microbatches in flight over all the virtual stages of each pipeline rank."""
        return [max(self.peak_rank[p::self.pp], default=0) for p in range(self.pp)]
