"""The emulated DP all-reduce (testbed/train/ring.py): a ring all-reduce's bytes on the wire,
step by step to the next rank, with no reduction arithmetic; and emulated ranks that allocate
no gradient tensors. Real torch.distributed processes over loopback (gloo); no GPU is mocked:
the GPU's reduction is a modelled sleep by design."""
from __future__ import annotations

import pytest

from glooranks import run_ranks
from testbed.launch.loopback import run_local
from testbed.readout.traces import load_traces
from testbed.spec import Compute, ModelSpec, Parallel, Workload
from testbed.spec.costs import FLOAT32_BYTES, ring_chunk_bytes, stage_params

pytestmark = pytest.mark.torch
MODEL = ModelSpec(layers=4, hidden=128, heads=4, seq_len=32, vocab=256)

# Run by test_the_ring_copies_and_never_adds in each of its processes: every rank sends its
# own value (rank + 1) around a ring of 3 whose chunks span several pieces.
RING_SCRIPT = """
import datetime, os, sys
import torch, torch.distributed as dist
from testbed.train.ring import EmulatedRing, PIECE_BYTES

class Tracer:
    steps = []
    def action(self, *a):
        if a[1] == "ALLREDUCE_STEP":
            self.steps.append(a)

rank, port = int(sys.argv[1]), sys.argv[2]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
dist.init_process_group("gloo", rank=rank, world_size=3,
                        timeout=datetime.timedelta(seconds=60))
numel = 3 * (PIECE_BYTES // 4) * 5 // 2  # a chunk of 2.5 pieces per step
tracer = Tracer()
ring = EmulatedRing([0, 1, 2], rank, None, {7: numel}, tracer)
ring.send_buf.fill_(rank + 1.0)
ring.recv_buf.fill_(-1.0)
ring.start(0, 7).wait()
got = set(ring.recv_buf.tolist())
sent = set(ring.send_buf.tolist())
whole = ring.pieces(7) == [PIECE_BYTES // 4] * 2 + [PIECE_BYTES // 8]
print(len(tracer.steps), sorted(got), sorted(sent), whole)
dist.destroy_process_group()
"""


def test_pieces_cover_the_chunk_within_the_buffer():
    from testbed.train.ring import PIECE_BYTES, EmulatedRing  # imports torch: here, not at collection (tests/cudadevices.py)
    numel = 3 * (PIECE_BYTES // FLOAT32_BYTES) * 2 + 7
    ring = EmulatedRing([0, 1, 2], 0, None, {0: numel, 1: 5}, tracer=None)
    assert sum(ring.pieces(0)) == ring.chunk_numel[0] == -(-numel // 3)
    assert max(ring.pieces(0)) * FLOAT32_BYTES == PIECE_BYTES == ring.recv_buf.numel() * 4
    assert ring.pieces(1) == [2]
    with pytest.raises(ValueError, match="at least 2 replicas"):
        EmulatedRing([0], 0, None, {0: 5}, tracer=None)


def test_the_ring_copies_and_never_adds(tmp_path):
    # A reducing ring leaves sums in its buffers (rank 1 would end with 1+2+3 = 6 or partial
    # sums); this one must leave the previous rank's value in the receive buffer and its own
    # untouched in the send buffer, after 2(d−1) = 4 steps.
    for rank, out in enumerate(run_ranks(RING_SCRIPT, 3, tmp_path)):
        assert out.split("[")[0].strip() == "4", out
        prev = (rank - 1) % 3 + 1.0
        assert f"[{prev}] [{rank + 1.0}]" in out, (rank, out)
        assert out.strip().endswith("True"), out  # two whole pieces and a half


@pytest.mark.slow
def test_emulated_all_reduce_moves_the_ring_bytes_to_the_next_rank(rank_pool, tmp_path):
    # pp = 2, dp = 2, two chunks per rank (zbv): per stage and iteration, 2(d−1) = 2 steps of
    # gradient bytes / d each to the next replica, one after the other, all before the rank's
    # ALLREDUCE_WAIT ends.
    w = Workload(model=MODEL, parallel=Parallel(pp=2, dp=2), schedule="zbv", chunks=2,
                 microbatches=4, iterations=3, warmup=1,
                 compute=Compute(forward_ms=5, backward_ms=10))
    run_local(w, tmp_path, timeout_s=120, pool=rank_pool)
    traces = load_traces(tmp_path)
    for rank, recs in traces.items():
        meta = next(r for r in recs if r["type"] == "meta")
        acts = [r for r in recs if r["type"] == "action" and r["iter"] == 1]
        nxt = ((meta["dp_rank"] + 1) % 2) * 2 + meta["pp_rank"]
        done = max(r["t1"] for r in acts if r["kind"] == "ALLREDUCE_WAIT")
        for stage in meta["stages"]:
            grad = stage_params(MODEL, stage, 4) * FLOAT32_BYTES
            steps = sorted((r for r in acts if r["kind"] == "ALLREDUCE_STEP"
                            and r["stage"] == stage), key=lambda r: r["mb"])
            assert [r["mb"] for r in steps] == [0, 1], (rank, stage, steps)
            assert {r["bytes"] for r in steps} == {ring_chunk_bytes(grad, 2)}
            assert {r["peer"] for r in steps} == {nxt}
            assert steps[0]["t1"] <= steps[1]["t0"] and steps[1]["t1"] <= done
            started = [r for r in acts if r["kind"] == "ALLREDUCE" and r["stage"] == stage]
            assert [r["bytes"] for r in started] == [grad]
