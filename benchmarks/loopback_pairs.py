"""How fast gloo moves bytes between processes of this machine when several pairs do it at
once: the cause the data-parallel benchmark names for its intra-DC all-reduces measuring
slower than predicted (docs/howto/data-parallel.md).

The simulator gives every unshaped pair of ranks ``calibration.UNSHAPED_BYTES_PER_S`` at
once, however many pairs move bytes together. Here 1, 2, 4 and 8 pairs of processes
(``torch.distributed`` gloo over loopback, one intra-op thread each) each send ten 27 MB
tensors, one pair member to the other, all pairs at the same time (a barrier before the
first): the time from the barrier to the last pair's end gives the bytes per second of each
pair and of all of them together, beside the simulator's rate for one pair.

    .venv/bin/python benchmarks/loopback_pairs.py [--save]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchsave import add_save, saved

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from testbed.launch.loopback import free_port  # noqa: E402
from testbed.sim.calibration import UNSHAPED_BYTES_PER_S  # noqa: E402

MESSAGE_BYTES = 27_000_000  # a wan-sharing cell's ring step of 54 MB gradients over 2 ranks
MESSAGES = 10


def _pair_member(rank: int, world: int, port: int, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.zeros(MESSAGE_BYTES // 4)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(MESSAGES):
        (dist.send if rank % 2 == 0 else dist.recv)(t, rank ^ 1)
    q.put(time.perf_counter() - t0)
    dist.barrier()
    dist.destroy_process_group()


def pairs_at_once(pairs: int) -> float:
    """Seconds until the last of ``pairs`` pairs has moved its messages."""
    ctx = mp.get_context("spawn")
    q, port = ctx.SimpleQueue(), free_port()
    procs = [ctx.Process(target=_pair_member, args=(r, 2 * pairs, port, q))
             for r in range(2 * pairs)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    return max(q.get() for _ in procs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_save(ap)
    args = ap.parse_args()
    with saved("loopback_pairs", args.save) as out:
        rows = []
        print(f"{MESSAGES} messages of {MESSAGE_BYTES} bytes per pair, {os.cpu_count()} CPUs; "
              f"the simulator's rate per pair: {UNSHAPED_BYTES_PER_S / 1e9:.2f} GB/s")
        print("| pairs at once | seconds | GB/s per pair | GB/s together | per pair / simulator's |")
        print("|---|---|---|---|---|")
        for pairs in (1, 2, 4, 8):
            s = pairs_at_once(pairs)
            each = MESSAGES * MESSAGE_BYTES / s
            row = {"pairs": pairs, "seconds": round(s, 3), "gb_s_per_pair": round(each / 1e9, 2),
                   "gb_s_together": round(pairs * each / 1e9, 2),
                   "per_pair_over_model": round(each / UNSHAPED_BYTES_PER_S, 2)}
            rows.append(row)
            print("| " + " | ".join(str(v) for v in row.values()) + " |")
        out.rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
