"""The project's executor: runs one rank's lowered schedule IR over torch.distributed P2P.

Receives are posted (``irecv``) at the start of each iteration for every RECV in the rank's
list, and waited for at the RECV action, just before the compute that needs them: the wait is
what the trace records as ``wait``. Sends are ``isend`` at the SEND action and completed at the
end of the iteration. Tags name the (direction, boundary, microbatch), so any order of
transfers between the same two ranks matches.

Compute is either real (the model's forward/backward; I and W split the backward with
``torch.autograd.grad`` and ``backward(inputs=…)``) or emulated: each F/B/I/W sleeps its
modelled time and the activation/gradient tensors of the true shape (× bytes_scale) cross
the network. Emulated ranks hold no model: one activation to send, one receive buffer that
every receive of every iteration lands in (nothing reads it), and the DP all-reduce of
``testbed.train.ring`` (a ring's bytes on the wire, its reduction slept, not computed). Real
compute receives into fresh tensors and all-reduces with gloo's ``all_reduce``.

With ``workload.filler`` every wait goes through the filler (``testbed.train.filler``), which
runs inference prefill requests inside the gap it predicts there, then waits as before.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from testbed.schedule.ir import Action, Kind
from testbed.spec.gradsync import AT_START
from testbed.spec.workload import Workload
from testbed.spec.costs import ComputeTimes, activation_numel, bytes_factor
from testbed.train import model as M
from testbed.train.filler import NoFiller
from testbed.train.rank import RankContext, modelled_ns, modelled_s, ns
from testbed.topology import Slot
from testbed.train import nccl
from testbed.train.dataparallel import DataParallel
from testbed.train.trace import Tracer
from testbed.train.transport import Transfer, Transport

# the tag of warm_up_connections' messages: above every (direction, boundary, microbatch) tag
WARM_UP_TAG = 1 << 23


def _tag(direction: int, boundary: int, mb: int, n_stages: int, m: int) -> int:
    return (direction * n_stages + boundary) * m + mb


@dataclass
class StageState:
    """What one iteration keeps per (stage, microbatch) between its actions."""

    inputs: dict[tuple[int, int], Any] = field(default_factory=dict)
    outputs: dict[tuple[int, int], Any] = field(default_factory=dict)
    grads_in: dict[tuple[int, int], Any] = field(default_factory=dict)   # from the next stage
    grads_out: dict[tuple[int, int], Any] = field(default_factory=dict)  # for the previous one
    losses: list[float] = field(default_factory=list)


class Executor(DataParallel):
    """Runs iterations of the rank's action list; real or emulated compute."""

    def __init__(self, ctx: RankContext, w: Workload, tracer: Tracer,
                 dp_group: Any | None = None, transport: Transport | None = None,
                 filler: Any | None = None, placement: list[Slot] | None = None,
                 dp_transport: Transport | None = None, device: torch.device | None = None):
        self.ctx, self.w, self.tr = ctx, w, tracer
        # the rank's GPU with dist_backend nccl (transport: testbed.train.nccl), else the CPU
        self.device = device or torch.device("cpu")
        self.on_gpu = self.device.type == "cuda"
        # every wait goes through it: testbed.train.filler.Filler fills the gap with prefill
        self.filler = filler or NoFiller()
        # P2P sends/receives, split over workload.connections TCP connections (transport.py)
        self.transport = transport or Transport()
        self.ordered = isinstance(self.transport, nccl.NcclTransport)
        self.real = w.compute.mode == "real"
        self.n_stages = ctx.schedule.n_stages
        self.m = w.microbatches
        self.stages = ctx.schedule.stages_of(ctx.pp_rank)
        self.actions = ctx.schedule.actions[ctx.pp_rank]
        self.dp_group = dp_group
        self.elem = activation_numel(w.model, w.microbatch_size, bytes_factor(w))
        self.shape = ((w.microbatch_size, w.model.seq_len, w.model.hidden) if self.real
                      else (self.elem,))
        if self.real:
            self._init_real()
        else:
            self.times = {s: ComputeTimes.from_workload(w, s, self.n_stages) for s in self.stages}
            # sent, never read: no page of it is written
            self.act = torch.empty(self.shape, device=self.device)
            # every receive lands here, once allocated: emulated compute reads none of them
            self.recv_buf = torch.empty(self.shape, device=self.device)
        # the DP all-reduce (ring.py) with the workload's algorithm over the placement: real
        # gradients, or (emulated) their true size × bytes_scale in chunk-sized buffers
        # (diloco/streaming: the outer all-reduces of the pseudo-gradient, outer.py, instead)
        self.ring, self.outer = self._data_parallel_parts(placement, dp_group, dp_transport)
        # a stage's gradients are complete after its last B (or W): with gradient_sync.overlap
        # its DP all-reduce starts there, overlapping whatever this rank still has to do
        self.grads_done_at = {}
        for i, a in enumerate(self.actions):
            if a.kind in (Kind.B, Kind.W) and w.gradient_sync.overlap \
                    and self.ring is not None:
                self.grads_done_at[a.stage] = i

    def _init_real(self) -> None:
        spec, n = self.w.model, self.n_stages
        self.modules = {s: M.build_stage(spec, s, n, self.w.seed).to(self.device)
                        for s in self.stages}
        params = [p for mod in self.modules.values() for p in mod.parameters()]
        self.params = params
        self.opt = torch.optim.Adam(params, lr=self.w.lr)
        gen = torch.Generator().manual_seed(self.w.seed)
        shape = (self.m, self.w.microbatch_size, spec.seq_len + 1)
        self.data = torch.randint(0, spec.vocab, shape, generator=gen).to(self.device)

    # ------------------------------------------------------------------ one iteration
    def iteration(self, it: int) -> float | None:
        """Run every action of this rank once; returns the mean loss on the last stage."""
        st = StageState()
        recvs = self._post_receives()
        sends: list[Any] = []
        reducing = []
        outer = self.outer.start(it, AT_START) if self.outer is not None else []
        for i, a in enumerate(self.actions):
            self._do(it, a, st, recvs, sends)
            if self.ctx.dp > 1 and self.grads_done_at.get(a.stage) == i:
                reducing.append(self._start_allreduce(it, a.stage))
        t0 = ns()
        self.filler.wait(it, ("SEND_WAIT", None, None), Transfer(sends), t0)
        self.tr.action(it, "SEND_WAIT", None, None, t0, ns(), "wait")
        self._data_parallel(it, reducing, outer)
        return sum(st.losses) / len(st.losses) if st.losses else None

    def warm_up_connections(self) -> None:
        """Send one activation-sized message to every pipeline neighbour and take one from
        each, all at once, before the first iteration: a fresh TCP connection starts with a
        small window and needs about ten round trips to open it, which the warm-up iteration
        would otherwise pay boundary after boundary. Nothing is measured here. diloco/streaming
        also run their outer all-reduces' warm-up rounds (outer.py): no warm-up iteration
        syncs."""
        peers = sorted({self.ctx.global_rank(n) for s in self.stages for n in (s - 1, s + 1)
                        if 0 <= n < self.n_stages} - {self.ctx.rank})
        if self.ordered:  # NCCL: communicators open pair by pair, in one global order
            nccl.warm_up(self.transport, peers, lambda: torch.empty(self.shape,
                                                                    device=self.device))
            return
        payload = torch.empty(self.shape)
        pending = []
        for peer in peers:
            pending.append(self.transport.isend(payload, peer, WARM_UP_TAG))
            pending.append(self.transport.irecv(torch.empty(self.shape), peer, WARM_UP_TAG))
        for transfer in pending:
            transfer.wait()
        if self.outer is not None:
            self.outer.warm_up()

    def _post_receives(self) -> dict[tuple[Kind, int, int], tuple[Any, torch.Tensor]]:
        out = {}
        for a in self.actions:
            if a.kind is Kind.RECV_F:
                peer, tag = self.ctx.global_rank(a.stage - 1), self._tag_f(a.stage - 1, a.microbatch)
            elif a.kind is Kind.RECV_B:
                peer, tag = self.ctx.global_rank(a.stage + 1), self._tag_b(a.stage, a.microbatch)
            else:
                continue
            buf = torch.empty(self.shape, device=self.device) if self.real else self.recv_buf
            out[(a.kind, a.stage, a.microbatch)] = (self.transport.irecv(buf, peer, tag), buf,
                                                    peer)
        return out

    def _tag_f(self, boundary: int, mb: int) -> int:
        return _tag(0, boundary, mb, self.n_stages, self.m)

    def _tag_b(self, boundary: int, mb: int) -> int:
        return _tag(1, boundary, mb, self.n_stages, self.m)

    def _do(self, it: int, a: Action, st: StageState, recvs: dict, sends: list) -> None:
        key = (a.stage, a.microbatch)
        if a.kind in (Kind.RECV_F, Kind.RECV_B):
            work, buf, peer = recvs[(a.kind, a.stage, a.microbatch)]
            t0 = ns()
            self.filler.wait(it, (a.kind.value, a.stage, a.microbatch), work, t0)
            self.tr.action(it, a.kind.value, a.stage, a.microbatch, t0, ns(), "wait",
                           buf.numel() * buf.element_size(), peer)
            target = st.inputs if a.kind is Kind.RECV_F else st.grads_in
            target[key] = buf
        elif a.kind in (Kind.SEND_F, Kind.SEND_B):
            fwd = a.kind is Kind.SEND_F
            tensor = st.outputs[key] if fwd else st.grads_out[key]
            peer = self.ctx.global_rank(a.stage + 1 if fwd else a.stage - 1)
            tag = self._tag_f(a.stage, a.microbatch) if fwd else self._tag_b(a.stage - 1,
                                                                               a.microbatch)
            t0 = ns()
            tensor = tensor.detach().contiguous()
            sends.append(self.transport.isend(tensor, peer, tag))
            self.tr.action(it, a.kind.value, a.stage, a.microbatch, t0, ns(), "comm",
                           tensor.numel() * tensor.element_size(), peer)
        else:
            t0 = ns()
            (self._real if self.real else self._emulated)(a, st)
            if self.real and self.on_gpu:  # the stamp when the GPU is done, not queued
                torch.cuda.current_stream().synchronize()
            t1 = ns()
            self.tr.action(it, a.kind.value, a.stage, a.microbatch, t0, t1, "compute",
                           model_ns=None if self.real else modelled_ns(self.times[a.stage],
                                                                       a.kind))
            self._hand_over_locally(a, st)

    def _hand_over_locally(self, a: Action, st: StageState) -> None:
        """Pass an output to a neighbouring stage this rank also owns (the fold of a V
        schedule): no send/recv, the tensor is handed over in memory."""
        owner, key = self.ctx.schedule.stage_to_rank, (a.stage, a.microbatch)
        if a.kind is Kind.F and a.stage + 1 < self.n_stages \
                and owner[a.stage + 1] == self.ctx.pp_rank:
            st.inputs[(a.stage + 1, a.microbatch)] = st.outputs[key]
        elif a.kind in (Kind.B, Kind.I) and a.stage > 0 and owner[a.stage - 1] == self.ctx.pp_rank \
                and key in st.grads_out:
            st.grads_in[(a.stage - 1, a.microbatch)] = st.grads_out[key]

    # ------------------------------------------------------------------ compute
    def _emulated(self, a: Action, st: StageState) -> None:
        key = (a.stage, a.microbatch)
        time.sleep(modelled_s(self.times[a.stage], a.kind))
        if a.kind is Kind.F:
            st.outputs[key] = self.act
        elif a.kind in (Kind.B, Kind.I):
            st.grads_out[key] = self.act

    def _real(self, a: Action, st: StageState) -> None:
        key = (a.stage, a.microbatch)
        mod = self.modules[a.stage]
        if a.kind is Kind.F:
            self._real_forward(a, st, mod)
            return
        out = st.outputs[key]
        inp = st.inputs.get(key)
        grad = None if mod.last else st.grads_in[key]
        if a.kind is Kind.W:
            torch.autograd.backward(out, grad, inputs=list(mod.parameters()))
            return
        if a.kind is Kind.I and inp is None:
            return  # the first stage has no input gradient: its W does all the work
        if a.kind is Kind.I and inp.requires_grad:
            (g,) = torch.autograd.grad(out, [inp], grad, retain_graph=True)
            st.grads_out[key] = g
            return
        torch.autograd.backward(out, grad, retain_graph=a.kind is Kind.I)
        if inp is not None and inp.requires_grad:
            st.grads_out[key] = inp.grad

    def _real_forward(self, a: Action, st: StageState, mod: M.Stage) -> None:
        key = (a.stage, a.microbatch)
        tokens = self.data[a.microbatch]
        if mod.first:
            x = tokens[:, :-1]
        else:
            x = st.inputs[key].detach().requires_grad_(True)
            st.inputs[key] = x
        out = mod(x)
        if mod.last:
            loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                                     tokens[:, 1:].reshape(-1)) / self.m
            st.losses.append(loss.item() * self.m)
            out = loss
        st.outputs[key] = out
