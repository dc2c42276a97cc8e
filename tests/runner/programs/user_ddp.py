"""Data-parallel training as a user writes it: DistributedDataParallel over gloo, a small
model whose forward sleeps FORWARD_MS and backward BACKWARD_MS, an ordinary loop. Every rank
prints one line per step:

    step 3 start 1234.567890 time 0.212345 compute 0.150123

With ``--mark`` it also reports each step to testbed (one import, one call; a no-op when
testbed is absent). Run it with ``torchrun --nproc_per_node 4 user_ddp.py``.
"""
import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
p.add_argument("--forward-ms", type=float, default=50.0)
p.add_argument("--backward-ms", type=float, default=100.0)
p.add_argument("--mark", action="store_true", help="tell testbed where each step ends")
args = p.parse_args()

try:
    from testbed.train.instrument import iteration
except ImportError:
    def iteration():
        pass

spent = [0.0]


class Slow(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        t = time.monotonic()
        time.sleep(args.forward_ms / 1e3)
        spent[0] += time.monotonic() - t
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        t = time.monotonic()
        time.sleep(args.backward_ms / 1e3)
        spent[0] += time.monotonic() - t
        return g


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

    def forward(self, x):
        return self.b(Slow.apply(torch.relu(self.a(x))))


dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(Net())
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(32, 64), torch.randn(32, 64)
for step in range(args.steps):
    start = time.monotonic()
    spent[0] = 0.0
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    if args.mark:
        iteration()
    took = time.monotonic() - start
    print(f"step {step} start {start:.6f} time {took:.6f} compute {spent[0]:.6f}", flush=True)
dist.destroy_process_group()
