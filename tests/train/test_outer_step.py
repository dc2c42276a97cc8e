"""The real outer step of diloco/streaming (testbed/train/outer.py ``OuterSync``) over real
gloo P2P between three processes (replicas in DCs a, b, c): the pseudo-gradients are
all-reduced and averaged, and Nesterov momentum is applied from the last outer parameters.

Each replica starts from the same parameters and takes its own local step: every parameter
falls by 0.1 × (replica + 1). The averaged pseudo-gradient is then 0.2 everywhere; with
momentum 0.9 the Nesterov step is 0.2 + 0.9 × 0.2 = 0.38, and with outer_lr 0.7 every replica
ends at its start − 0.266. Overlapped (streaming, overlap_steps 1), a replica's local progress
during the all-reduce stays on top of the outer result.
"""
from __future__ import annotations

import pytest

from glooranks import run_ranks

pytestmark = pytest.mark.torch

SCRIPT = """
import datetime, os, sys, types
import torch, torch.distributed as dist
from testbed.spec.gradsync import AFTER_LAST_ACTION, AT_START, GradientSync
from testbed.topology import Slot
from testbed.train.outer import OuterSync

rank, port, cases = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
dist.init_process_group("gloo", rank=rank, world_size=3, timeout=datetime.timedelta(seconds=60))


def case(mode, dtype):
    torch.manual_seed(0)
    module = torch.nn.Linear(5, 4)  # 24 parameters, the same on every replica
    start = torch.nn.utils.parameters_to_vector(module.parameters()).detach().clone()
    if mode == "diloco":
        sync = GradientSync(mode="diloco", inner_steps=2, outer_dtype=dtype)
        it, where = 1, AFTER_LAST_ACTION
    else:
        sync = GradientSync(mode="streaming", inner_steps=2, fragments=2, overlap_steps=1)
        it, where = 1, AT_START  # fragment 0 (12 elements) after inner step 1, beside step 2
    records = []
    ex = types.SimpleNamespace(w=types.SimpleNamespace(gradient_sync=sync), real=True,
                               ctx=types.SimpleNamespace(rank=rank, dp=3), modules={0: module},
                               tr=types.SimpleNamespace(action=lambda *a: records.append(a)))
    slots = [Slot(d, 0, d, "abc"[d], 0) for d in range(3)]
    outer = OuterSync(ex, slots, None, None, {0: 24})
    varied = torch.linspace(1, 2, 24)  # "varied": element k falls by 0.1 (rank + 1) varied[k]
    with torch.no_grad():
        for p, k in zip(module.parameters(), (0, 20)):
            p -= 0.1 * (rank + 1) * (varied[k:k + p.numel()].view_as(p) if dtype != "fp32" else 1)
    pending = outer.start(it, where)
    if mode == "streaming":  # the inner step the all-reduce runs beside
        with torch.no_grad():
            for p in module.parameters():
                p -= 0.01 * (rank + 1)
    outer.finish(it, pending)
    end = torch.nn.utils.parameters_to_vector(module.parameters()).detach()
    name = f"{mode}:{dtype}"
    print(name, "moved", " ".join(repr(v) for v in (end - start).tolist()))
    print(name, "records", " ".join(sorted({a[1] for a in records})))
    print(name, "bytes", " ".join(str(a[7]) for a in records if a[1] == "ALLREDUCE_STEP"))


for c in cases:  # one after another, on the one process group
    case(*c.split(":"))
dist.destroy_process_group()
"""
# every case the tests check, run by one set of three processes (each of which imports torch:
# about 2 s of CPU) rather than one set per test
CASES = ("diloco:fp32", "streaming:fp32", "diloco:bf16", "diloco:int8", "diloco:int4")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[tuple[list[float], str, list[int]]]]:
    """Per case (``mode:dtype``), per rank: (each parameter's change, the kinds of the
    actions traced, the bytes of each ALLREDUCE_STEP)."""
    got: dict[str, list] = {c: [] for c in CASES}
    for out in run_ranks(SCRIPT, 3, tmp_path_factory.mktemp("outer"), *CASES):
        lines = {tuple(line.split(" ", 2)[:2]): (line.split(" ", 2) + [""])[2]
                 for line in out.splitlines()}
        for c in CASES:
            got[c].append(([float(v) for v in lines[c, "moved"].split()], lines[c, "records"],
                           [int(b) for b in lines[c, "bytes"].split()]))
    return got


def test_diloco_outer_step_averages_and_applies_nesterov_on_every_replica(runs):
    for moved, records, _ in runs["diloco:fp32"]:
        assert moved == pytest.approx([-0.266] * 24, abs=1e-5)
        assert records == "ALLREDUCE ALLREDUCE_BUCKET ALLREDUCE_STEP ALLREDUCE_WAIT"


def test_an_overlapped_fragment_keeps_the_local_progress_made_beside_it(runs):
    for rank, (moved, _, _) in enumerate(runs["streaming:fp32"]):
        # fragment 0: the outer result plus this replica's step beside the all-reduce;
        # fragment 1: not synchronised, only the replica's own two steps
        assert moved[:12] == pytest.approx([-0.266 - 0.01 * (rank + 1)] * 12, abs=1e-5)
        assert moved[12:] == pytest.approx([-0.11 * (rank + 1)] * 12, abs=1e-5)


# The largest error one encoding adds to a value, as a fraction of its chunk's largest
# magnitude: half a step (int8: 1/127, int4: 1/7), bfloat16's 8-bit significand rounding.
HALF_STEP = {"bf16": 2 ** -8, "int8": 0.5 / 127, "int4": 0.5 / 7}


@pytest.mark.parametrize("dtype", ["bf16", "int8", "int4"])
def test_a_narrow_outer_dtype_sends_its_bytes_sums_in_fp32_and_leaves_replicas_equal(
        runs, dtype):
    """Replica r's pseudo-gradient at element k is 0.1 (r + 1) v_k, v_k from 1 to 2: the
    average is 0.2 v_k and the outer step moves every replica by −0.7 × 1.9 × 0.2 v_k. Sent
    in ``dtype`` the result is that within the encoding's rounding (each of the ring's 4
    steps of 3 replicas encodes once, a chunk's largest partial sum is 0.6 × 2), and every
    replica ends with the very same values."""
    runs = runs[f"diloco:{dtype}"]
    exact = [-0.266 * v for v in [1 + k / 23 for k in range(24)]]
    bound = 1.33 * 4 * HALF_STEP[dtype] * 0.6 * 2 / 3
    for moved, records, step_bytes in runs:
        assert moved == pytest.approx(exact, abs=bound), (dtype, moved)
        assert moved != pytest.approx(exact, abs=1e-5), "nothing was rounded"
        # 24 parameters in 3 chunks of 8: each step's message is 8 values in dtype (+ scale)
        per_value = {"bf16": 2, "int8": 1, "int4": 0.5}[dtype]
        assert step_bytes == [int(8 * per_value) + (4 if dtype != "bf16" else 0)] * 4
    assert runs[0][0] == runs[1][0] == runs[2][0]  # bit for bit: the same messages decoded
