"""A plain torch.distributed.pipelining program with known compute times: each stage's
forward sleeps --forward-ms and its backward --backward-ms (a custom autograd Function), so
its bubble can be checked against theory. Nothing in it knows about testbed; run it with
torchrun, or through testbed's ``workload.program``.

It times each schedule step itself: from the earliest start to the latest end over all ranks
(one barrier before each step; CLOCK_MONOTONIC), printed by rank 0 as ``step N: X.XXXXXX s``.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime


class Sleep(torch.autograd.Function):
    """Identity whose forward sleeps ``f`` s and whose backward sleeps ``b`` s."""

    @staticmethod
    def forward(ctx, x, f, b):
        ctx.b = b
        time.sleep(f)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.b)
        return grad, None, None


class SleepyStage(nn.Module):
    def __init__(self, f_s: float, b_s: float):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))
        self.f_s, self.b_s = f_s, b_s

    def forward(self, x):
        return Sleep.apply(x * self.w, self.f_s, self.b_s)


def make_schedule(name: str, stage: PipelineStage, microbatches: int):
    loss = lambda out, target: out.mean()  # noqa: E731
    if name == "gpipe":
        return ScheduleGPipe(stage, microbatches, loss_fn=loss)
    if name == "1f1b":
        return Schedule1F1B(stage, microbatches, loss_fn=loss)
    runtime = _PipelineScheduleRuntime([stage], microbatches, loss_fn=loss)
    runtime._load_csv(name)  # a compute-only CSV schedule
    return runtime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedule", default="gpipe", help="gpipe, 1f1b or a CSV file")
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--forward-ms", type=float, default=40)
    ap.add_argument("--backward-ms", type=float, default=40)
    ap.add_argument("--width", type=int, default=256)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    module = SleepyStage(args.forward_ms / 1000, args.backward_ms / 1000)
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    schedule = make_schedule(args.schedule, stage, args.microbatches)
    x = torch.randn(args.microbatches, args.width)
    for step in range(args.steps):
        dist.barrier()
        t0 = time.monotonic_ns()
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=torch.zeros(args.microbatches), losses=[])
        else:
            schedule.step()
        t1 = time.monotonic_ns()
        span = torch.tensor([-t0, t1], dtype=torch.int64)
        dist.all_reduce(span, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"step {step}: {(span[1] + span[0]).item() / 1e9:.6f} s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
