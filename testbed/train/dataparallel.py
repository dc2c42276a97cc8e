"""The data-parallel part of an executor: each stage's gradient all-reduce
(``testbed.train.ring`` with the workload's ``gradient_sync``) and the optimizer step.

A stage's all-reduce starts when its gradients are complete (its last B or W, with
``gradient_sync.overlap``) or after the rank's last action; the rank waits for all of them in
ALLREDUCE_WAIT, which is the part the all-reduce did not overlap.
"""
from __future__ import annotations

from typing import Any

import torch

from testbed.spec.allreduce import rank_steps
from testbed.spec.costs import bytes_factor, stage_params
from testbed.spec.gradsync import AFTER_LAST_ACTION
from testbed.topology import Slot
from testbed.topology.slot import single_host_placement
from testbed.train.rank import ns
from testbed.train.outer import OuterSync
from testbed.train.ring import GradientRing
from testbed.train.transport import Transfer, Transport


class DataParallel:
    """Mixed into ``testbed.train.executor.Executor``: uses its ctx, w, tr, real, stages,
    modules, opt and filler."""

    def _data_parallel_parts(self, placement: list[Slot] | None, group: Any,
                             transport: Transport | None
                             ) -> tuple[GradientRing | None, OuterSync | None]:
        """(every-step all-reduce, outer sync): the one the workload's gradient_sync.mode
        runs; neither with dp = 1. Without a placement the replicas share one DC."""
        ctx = self.ctx
        if ctx.dp == 1:
            return None, None
        if placement is None:
            placement = single_host_placement(ctx.pp, ctx.dp)
        if self.w.gradient_sync.outer:
            numel = ({s: sum(p.numel() for p in self.modules[s].parameters())
                      for s in self.stages} if self.real else self._grad_numel())
            return None, OuterSync(self, placement, group, transport, numel)
        return self._gradient_ring(placement, group, transport), None

    def _gradient_ring(self, placement: list[Slot], group: Any,
                       transport: Transport | None) -> GradientRing:
        """This rank's all-reduce steps for each of its stages (``testbed.spec.allreduce``)."""
        ctx, sync = self.ctx, self.w.gradient_sync
        numel = self._grad_numel()
        steps = {s: rank_steps(placement, ctx.rank, n, sync.algorithm, sync.bucket_numel)
                 for s, n in numel.items()}
        return GradientRing(steps, group, numel, self.tr, transport)

    def _grad_numel(self) -> dict[int, int]:
        """Gradient elements (float32, × bytes_scale) of each of this rank's stages; real
        compute: its modules' parameters."""
        if self.real:
            return {s: sum(p.numel() for p in self.modules[s].parameters()) for s in self.stages}
        return {s: max(1, int(stage_params(self.w.model, s, self.n_stages)
                              * bytes_factor(self.w))) for s in self.stages}

    def _start_allreduce(self, it: int, stage: int) -> tuple[int, Any, torch.Tensor | None]:
        """Start the asynchronous DP all-reduce of one stage's gradients: the real gradients
        (summed in place), or, emulated, their bytes without the arithmetic."""
        if self.real:
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                              for p in self.modules[stage].parameters()])
            t0 = ns()
            work = self.ring.start(it, stage, flat)
            nbytes = flat.numel() * flat.element_size()
        else:
            flat, t0 = None, ns()
            work, nbytes = self.ring.start(it, stage), self.ring.gradient_bytes(stage)
        self.tr.action(it, "ALLREDUCE", stage, None, t0, ns(), "comm", nbytes, None)
        return stage, work, flat

    def _data_parallel(self, it: int, reducing: list | None = None,
                       outer: list | None = None) -> None:
        """Finish the DP all-reduces (starting those not started yet), then the optimizer
        step. The wait is what the all-reduce did not overlap. diloco/streaming: the local
        optimizer step, then this iteration's outer all-reduces (``outer``: those started
        with it) and the outer step."""
        if self.outer is not None:
            self._local_step(it)
            late = self.outer.start(it, AFTER_LAST_ACTION)
            self.outer.finish(it, (outer or []) + late)
            return
        if self.ctx.dp > 1:
            if not reducing:
                reducing = [self._start_allreduce(it, s) for s in self.stages]
            t0 = ns()
            self.filler.wait(it, ("ALLREDUCE_WAIT", None, None),
                        Transfer([work for _, work, _ in reducing]), t0)
            self.tr.action(it, "ALLREDUCE_WAIT", None, None, t0, ns(), "wait")
            if self.real:
                for stage, _, flat in reducing:
                    self._unflatten(self.modules[stage].parameters(), flat / self.ctx.dp)
        self._local_step(it)

    def _local_step(self, it: int) -> None:
        """The optimizer step on this replica's gradients (real compute)."""
        if self.real:
            t0 = ns()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.tr.action(it, "OPT", None, None, t0, ns(), "compute")

    @staticmethod
    def _unflatten(params, flat: torch.Tensor) -> None:
        off = 0
        for p in params:
            n = p.numel()
            p.grad = flat[off:off + n].view_as(p).clone()
            off += n
