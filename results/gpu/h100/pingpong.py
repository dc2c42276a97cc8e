"""One rank of a ping-pong over loopback: small round trips and 4 MiB out + 1 element back.
argv: backend (nccl|gloo). Prints medians (rank 0)."""
import os, statistics, sys, time
import torch, torch.distributed as dist
be = sys.argv[1]
rank = int(os.environ["RANK"])
dev = torch.device("cuda", 0) if be == "nccl" else torch.device("cpu")
if be == "nccl":
    torch.cuda.set_device(0)
dist.init_process_group(be)
one = torch.zeros(1, device=dev); big = torch.zeros(1 << 20, device=dev)
def sync():
    if be == "nccl": torch.cuda.synchronize()
def trip(x):
    t0 = time.perf_counter()
    if rank == 0:
        dist.send(x, 1); dist.recv(one, 1); sync()
    else:
        dist.recv(x, 0); sync(); dist.send(one, 0); sync()
    return time.perf_counter() - t0
for _ in range(5): trip(one); trip(big)
small = [trip(one) for _ in range(40)]
large = [trip(big) for _ in range(20)]
if rank == 0:
    print(f"{be} small_rtt_ms {1e3*statistics.median(small):.3f} big_out_small_back_ms {1e3*statistics.median(large):.3f}"
          f" small_min_ms {1e3*min(small):.3f}", flush=True)
dist.destroy_process_group()
