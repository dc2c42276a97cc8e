"""The low-communication modes of the built-in worker (``gradient_sync.mode`` diloco or
streaming, ``testbed.spec.gradsync``): no all-reduce in an inner step; in a sync step, the
outer all-reduce of the pseudo-gradient of one fragment (diloco: all) of each of the rank's
stages, over the same rings as the every-step all-reduce (``testbed.train.ring``).

Emulated compute moves the pseudo-gradient's bytes in ``outer_dtype`` and does no arithmetic.
Real compute all-reduces the real pseudo-gradient (the parameters at the last outer step minus
now), each chunk sent in ``outer_dtype`` and added in float32 (``testbed.train.wirecodec``),
averages it and takes an outer Nesterov step from the last outer parameters.
A fragment whose all-reduce ran beside an inner step (``overlap_steps: 1``) keeps that step's
local progress on top of the outer result.

Each all-reduce is traced as ALLREDUCE (its start), ALLREDUCE_STEP records and the rank's
ALLREDUCE_WAIT (its stall), as the every-step all-reduce is, so the same readout measures it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from testbed.spec.allreduce import rank_steps
from testbed.spec.gradsync import AT_START, OUTER_WARM_UP_ROUNDS
from testbed.train.rank import ns
from testbed.train.ring import GradientRing
from testbed.train.wirecodec import WireCodec


@dataclass
class Pending:
    """One fragment's outer all-reduce in flight."""

    stage: int
    fragment: int
    work: Any
    delta: torch.Tensor | None = None     # real: the pseudo-gradient, summed in place
    at_start: torch.Tensor | None = None  # real, overlapped: the fragment when it began


class OuterSync:
    """The outer all-reduces of one rank. ``numel[stage]``: the stage's parameters (real) or
    its gradient elements × bytes_scale (emulated)."""

    def __init__(self, executor: Any, placement, group, transport, numel: dict[int, int]):
        self.ex, self.sync = executor, executor.w.gradient_sync
        self.real, self.numel = executor.real, numel
        self.frags = self.sync.outer_fragments
        steps, sizes = {}, {}
        for s, n in numel.items():
            for f in range(self.frags):
                key = s * self.frags + f
                sizes[key] = (self.sync.fragment_numel(n, f)[1] if self.real
                              else self.sync.wire_numel(n, f))
                steps[key] = rank_steps(placement, executor.ctx.rank, sizes[key],
                                        self.sync.algorithm, self.sync.bucket_numel)
        coded = self.real and self.sync.outer_dtype != "fp32"  # fp32: the plain real ring
        self.ring = GradientRing(steps, group, sizes, executor.tr, transport,
                                 WireCodec(self.sync.outer_dtype) if coded else None)
        self.anchor: dict[int, torch.Tensor] = {}
        self.momentum: dict[int, torch.Tensor] = {}
        if self.real:
            for s in numel:
                self.anchor[s] = self._vector(s).detach().clone()
                self.momentum[s] = torch.zeros_like(self.anchor[s])

    def warm_up(self) -> None:
        """Before the first iteration, OUTER_WARM_UP_ROUNDS all-reduces of every fragment of every
        stage, traced as iteration -1 (never measured), nothing added to any parameter. The
        replicas' connections are otherwise opened by the first measured syncs: their TCP
        windows grow only while a step's chunk fills them, over several syncs (measured: the
        first two syncs of 4.6 MB steps 25 % slower than the later ones after one round)."""
        for _ in range(OUTER_WARM_UP_ROUNDS):
            for f in range(self.frags):  # real: zeros, sent in outer_dtype as a sync sends
                works = [self.ring.start(-1, k, torch.zeros(self.ring.numel[k]) if self.real
                                         else None)
                         for k in (s * self.frags + f for s in self.numel)]
                for work in works:
                    work.wait()

    def _vector(self, stage: int) -> torch.Tensor:
        return parameters_to_vector(self.ex.modules[stage].parameters())

    def start(self, it: int, where: str) -> list[Pending]:
        """Start this iteration's outer all-reduces that begin ``where``."""
        out = []
        for f, w in self.sync.syncs_in(it):
            if w != where:
                continue
            for s in self.numel:
                key = s * self.frags + f
                delta = snap = None
                if self.real:
                    first, n = self.sync.fragment_numel(self.numel[s], f)
                    now = self._vector(s).detach()[first:first + n]
                    delta = (self.anchor[s][first:first + n] - now).clone()
                    snap = now.clone() if where == AT_START else None
                t0 = ns()
                work = self.ring.start(it, key, delta)
                self.ex.tr.action(it, "ALLREDUCE", s, f, t0, ns(), "comm",
                                  self.ring.gradient_bytes(key), None)
                out.append(Pending(s, f, work, delta, snap))
        return out

    def finish(self, it: int, pending: list[Pending]) -> None:
        """Wait for ``pending`` (the stall, traced as ALLREDUCE_WAIT), then, real, the outer
        step of each fragment."""
        if not pending:
            return
        t0 = ns()
        for p in pending:
            p.work.wait()
        self.ex.tr.action(it, "ALLREDUCE_WAIT", None, None, t0, ns(), "wait")
        if self.real:
            for p in pending:
                self._outer_step(p)

    def _outer_step(self, p: Pending) -> None:
        """Nesterov momentum on the averaged pseudo-gradient, from the last outer parameters."""
        first, n = self.sync.fragment_numel(self.numel[p.stage], p.fragment)
        sl = slice(first, first + n)
        delta = p.delta / self.ex.ctx.dp
        mom = self.momentum[p.stage][sl]
        mom.mul_(self.sync.outer_momentum).add_(delta)
        step = delta + self.sync.outer_momentum * mom
        outer = self.anchor[p.stage][sl] - self.sync.outer_lr * step
        self.anchor[p.stage][sl] = outer
        vec = self._vector(p.stage).detach().clone()
        local = vec[sl] - p.at_start if p.at_start is not None else 0.0
        vec[sl] = outer + local
        with torch.no_grad():
            vector_to_parameters(vec, self.ex.modules[p.stage].parameters())
