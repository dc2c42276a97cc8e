"""A pipeline-parallel training script as a user writes one, with no testbed in mind.

Each stage is a tiny linear layer whose forward sleeps FORWARD_MS and whose backward sleeps
BACKWARD_MS, so compute time is known. The training loop is an ordinary one: optional barrier,
``schedule.step``, optimizer step; the next step starts as soon as this rank is done, so
ranks drift apart as a real pipeline does. Every rank prints one line per step:

    step 3 start 1234.567890 time 0.812345 compute 0.480123

``start`` is time.monotonic() at the top of the loop body, ``time`` the whole body's duration
and ``compute`` the seconds this rank spent inside its stages' forward and backward.
Run it with ``torchrun --nproc_per_node 4 plain_pipeline.py --schedule 1f1b``, or through
testbed: experiments/program-own.yaml.
"""
import argparse
import time

import torch
import torch.distributed as dist
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                          ScheduleInterleaved1F1B)

p = argparse.ArgumentParser()
p.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved"], default="gpipe")
p.add_argument("--barrier", action="store_true", help="dist.barrier() before each step")
p.add_argument("--microbatches", type=int, default=8)
p.add_argument("--steps", type=int, default=8)
p.add_argument("--forward-ms", type=float, default=20.0)
p.add_argument("--backward-ms", type=float, default=40.0)
p.add_argument("--busy", action="store_true",
               help="compute by spinning on this thread's CPU time instead of sleeping")
args = p.parse_args()

spent = [0.0]  # seconds of stage compute in the current step


def work(ms):
    if not args.busy:
        time.sleep(ms / 1e3)
        return
    end = time.thread_time() + ms / 1e3
    while time.thread_time() < end:
        pass


class SlowIdentity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        t = time.monotonic()
        work(args.forward_ms)
        spent[0] += time.monotonic() - t
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        t = time.monotonic()
        work(args.backward_ms)
        spent[0] += time.monotonic() - t
        return g


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)

    def forward(self, x):
        return SlowIdentity.apply(self.lin(x))


dist.init_process_group(backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(1234)
per_rank = 2 if args.schedule == "interleaved" else 1
n_stages = world * per_rank
stage_ids = [rank + k * world for k in range(per_rank)]
stages = [PipelineStage(Block(), i, n_stages, torch.device("cpu")) for i in stage_ids]
params = [q for s in stages for q in s.submod.parameters()]
opt = torch.optim.SGD(params, lr=0.01)


def loss_fn(out, target):
    return torch.nn.functional.mse_loss(out, target)


if args.schedule == "gpipe":
    sched = ScheduleGPipe(stages[0], args.microbatches, loss_fn=loss_fn)
elif args.schedule == "1f1b":
    sched = Schedule1F1B(stages[0], args.microbatches, loss_fn=loss_fn)
else:
    sched = ScheduleInterleaved1F1B(stages, args.microbatches, loss_fn=loss_fn)

batch = torch.randn(args.microbatches * 4, 32)
target = torch.randn(args.microbatches * 4, 32)
for step in range(args.steps):
    start = time.monotonic()
    spent[0] = 0.0
    if args.barrier:
        dist.barrier()
    opt.zero_grad()
    kwargs = {}
    if 0 in stage_ids:
        kwargs["x"] = batch
    if n_stages - 1 in stage_ids:
        kwargs["target"] = target
    if "x" in kwargs:
        sched.step(kwargs.pop("x"), **kwargs)
    else:
        sched.step(**kwargs)
    opt.step()
    took = time.monotonic() - start
    print(f"step {step} start {start:.6f} time {took:.6f} compute {spent[0]:.6f}", flush=True)

dist.destroy_process_group()
