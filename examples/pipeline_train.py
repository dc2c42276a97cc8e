"""A plain torch.distributed.pipelining training script (nothing in it knows about testbed):
a small residual-MLP language model on synthetic next-token data, one pipeline stage per rank,
trained with Adam. Run it with torchrun, or unmodified through testbed's ``workload.program``.

    torchrun --nproc-per-node 4 examples/pipeline_train.py --schedule 1f1b
    torchrun --nproc-per-node 4 examples/pipeline_train.py --schedule my_schedule.csv

``--schedule`` is gpipe, 1f1b, or a compute-only CSV schedule (torch's ``_load_csv`` format).
Rank 0 prints ``step N: X.XXXXXX s`` and the last rank ``step N loss L``.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class Stage(nn.Module):
    """Stage ``index`` of ``n``: embedding on the first, head on the last."""

    def __init__(self, index: int, n: int, layers: int, width: int, vocab: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width) if index == 0 else None
        self.blocks = nn.Sequential(*[Block(width) for _ in range(layers // n)])
        self.head = nn.Linear(width, vocab) if index == n - 1 else None

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        x = self.blocks(x)
        return self.head(x) if self.head is not None else x


def cross_entropy(logits, target):
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def make_schedule(name: str, stage: PipelineStage, microbatches: int):
    if name == "gpipe":
        return ScheduleGPipe(stage, microbatches, loss_fn=cross_entropy)
    if name == "1f1b":
        return Schedule1F1B(stage, microbatches, loss_fn=cross_entropy)
    runtime = _PipelineScheduleRuntime([stage], microbatches, loss_fn=cross_entropy)
    runtime._load_csv(name)
    return runtime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedule", default="1f1b", help="gpipe, 1f1b or a CSV file")
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16, help="sequences per step")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    model = Stage(rank, world, args.layers, args.width, args.vocab)
    stage = PipelineStage(model, rank, world, torch.device("cpu"))
    schedule = make_schedule(args.schedule, stage, args.microbatches)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(0)
    for step in range(args.steps):
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1), generator=data)
        tokens[:, 1::2] = tokens[:, 0:-1:2]  # a learnable pattern: every odd token repeats
        opt.zero_grad()
        dist.barrier()
        t0 = time.monotonic()
        losses: list = []
        if rank == 0:
            schedule.step(tokens[:, :-1])
        elif rank == world - 1:
            schedule.step(target=tokens[:, 1:], losses=losses)
        else:
            schedule.step()
        took = time.monotonic() - t0
        opt.step()
        if rank == 0:
            print(f"step {step}: {took:.6f} s", flush=True)
        if losses:
            print(f"step {step} loss {torch.stack(losses).mean().item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
