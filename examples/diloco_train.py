"""DiLoCo with plain torch.distributed (nothing in it knows about testbed): every rank holds a
whole replica of a small residual-MLP language model and trains it on its own synthetic
next-token data with AdamW for H inner steps; then the replicas average their pseudo-gradients
(the parameters at the last outer step minus now) with ``all_reduce``, one call per parameter
tensor, and an outer SGD with Nesterov momentum applies them from the last outer parameters.

    torchrun --nproc-per-node 3 examples/diloco_train.py --inner-steps 10 --outer-steps 3

``--dtype bf16`` sends the pseudo-gradients in bfloat16; ``--async-sync`` starts every
tensor's all-reduce with ``async_op=True`` and then waits for them all. Rank 0 prints
``outer step K: loss L, sync S s`` after every outer step.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class Model(nn.Module):
    def __init__(self, layers: int, width: int, vocab: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.Sequential(*[Block(width) for _ in range(layers)])
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens):
        return self.head(self.blocks(self.embed(tokens)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inner-steps", type=int, default=10)
    ap.add_argument("--outer-steps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--async-sync", action="store_true",
                    help="start all the all-reduces at once, then wait for them")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial replica everywhere
    model = Model(args.layers, args.width, args.vocab)
    params = list(model.parameters())
    inner = torch.optim.AdamW(params, lr=args.lr)
    outer = torch.optim.SGD(params, lr=args.outer_lr, momentum=0.9, nesterov=True)
    anchor = [p.detach().clone() for p in params]
    wire = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    data = torch.Generator().manual_seed(1000 + rank)  # each replica its own data
    loss_fn = nn.CrossEntropyLoss()

    for k in range(args.outer_steps):
        for _ in range(args.inner_steps):
            tokens = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1), generator=data)
            logits = model(tokens[:, :-1])
            loss = loss_fn(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
            loss.backward()
            inner.step()
            inner.zero_grad()
        t0 = time.perf_counter()
        deltas = [(a - p.detach()).to(wire) for p, a in zip(params, anchor)]
        if args.async_sync:
            for work in [dist.all_reduce(d, async_op=True) for d in deltas]:
                work.wait()
        else:
            for d in deltas:
                dist.all_reduce(d)
        for p, a, d in zip(params, anchor, deltas):
            p.grad = d.float() / world
            p.data.copy_(a)
        outer.step()
        outer.zero_grad()
        anchor = [p.detach().clone() for p in params]
        if rank == 0:
            print(f"outer step {k}: loss {loss.item():.4f}, sync {time.perf_counter() - t0:.3f} s",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
