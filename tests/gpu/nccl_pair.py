"""One rank of a two-rank NCCL exchange over loopback (tests/gpu/test_nccl_gpu.py): rank 0
sends a CUDA tensor of 1 MiB to rank 1, which checks its contents. Both ranks use GPU 0.
Run with torchrun's variables and whatever NCCL environment the test gives."""
import os
import sys

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
torch.cuda.set_device(0)
dist.init_process_group("nccl")
x = torch.arange(1 << 18, dtype=torch.float32, device="cuda")
if rank == 0:
    dist.send(x, dst=1)
else:
    y = torch.zeros_like(x)
    dist.recv(y, src=0)
    assert torch.equal(x, y), "the bytes arrived changed"
torch.cuda.synchronize()
dist.destroy_process_group()
print(f"rank {rank} ok", file=sys.stderr)
