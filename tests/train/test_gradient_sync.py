"""The real-compute all-reduce (testbed/train/ring.py ``GradientRing`` with real tensors):
both algorithms sum every replica's gradients, bucket by bucket, over real gloo P2P between
processes over loopback; the replicas sit in two DCs of the placement."""
from __future__ import annotations

import pytest

from glooranks import run_ranks

pytestmark = pytest.mark.torch

# each of 4 ranks (replicas of one stage, in the DCs a string names, e.g. a b a b) all-reduces
# its own vector: element i of rank r is (r + 1) * (i + 1); the sum is 10 * (i + 1)
SCRIPT = """
import datetime, os, sys
import torch, torch.distributed as dist
from testbed.spec.allreduce import rank_steps
from testbed.topology import Slot
from testbed.train.ring import GradientRing

rank, port, cases = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
dist.init_process_group("gloo", rank=rank, world_size=4,
                        timeout=datetime.timedelta(seconds=60))
for case in cases:  # one after another, on the one process group
    algorithm, bucket, dcs = case.split(":")
    slots = [Slot(d, 0, d, dcs[d], dcs[:d].count(dcs[d])) for d in range(4)]
    numel = 1001
    steps = {0: rank_steps(slots, rank, numel, algorithm, int(bucket) or None)}
    ring = GradientRing(steps, None, {0: numel}, None)
    flat = torch.arange(1, numel + 1, dtype=torch.float32) * (rank + 1)
    ring.start(0, 0, flat).wait()
    want = torch.arange(1, numel + 1, dtype=torch.float32) * 10
    print(case, len(steps[0]), bool(torch.equal(flat, want)))
dist.destroy_process_group()
"""
CASES = [
    ("ring", 0, "abab", 6),
    ("hierarchical", 300, "abab", 16),
    # unequal DCs (3 replicas and 1): 2 + 2 × 3 pieces + 2 steps per bucket, some idle
    ("hierarchical", 300, "aaba", 40)]


def _case(algorithm, bucket, dcs) -> str:
    return f"{algorithm}:{bucket}:{dcs}"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> list[dict[str, list[str]]]:
    """Per rank, per case: what the rank printed (its steps, whether its sum is right). One
    set of four processes runs every case (each process imports torch: about 2 s of CPU)."""
    cases = [_case(*c[:3]) for c in CASES]
    outs = run_ranks(SCRIPT, 4, tmp_path_factory.mktemp("sync"), *cases)
    return [{line.split()[0]: line.split()[1:] for line in out.splitlines()} for out in outs]


@pytest.mark.parametrize("algorithm,bucket,dcs,steps", CASES)
def test_the_real_all_reduce_sums_every_replica(outputs, algorithm, bucket, dcs, steps):
    for out in outputs:
        assert out[_case(algorithm, bucket, dcs)] == [str(steps), "True"], out
