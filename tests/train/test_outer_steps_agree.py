"""The worker's outer all-reduce (testbed/train/outer.py) and the simulator's
(testbed/plan/outer.py) move the same ring steps: same chunks, same peers, same buckets, for
every fragment, dtype and algorithm. Emulated compute: the workers' rings are built, nothing
is sent."""
from __future__ import annotations

import types

import pytest

from testbed.plan import plan_cell
from testbed.plan.outer import grad_numel, sync_input
from testbed.spec import load_experiment
from testbed.spec.gradsync import AFTER_LAST_ACTION

pytestmark = pytest.mark.torch

EXPERIMENT = """\
name: agree
topology:
  name: agree
  dcs: [{name: aa, hosts: 4}, {name: ab, hosts: 4}]
  inter_dc: {delay_ms: 10, rate_mbit: 100}
workload:
  model: {layers: 4, hidden: 128, heads: 4, seq_len: 32, vocab: 256}
  parallel: {pp: 2, dp: 4}
  schedule: 1f1b
  microbatches: 4
  compute: {mode: emulated, forward_ms: 5, backward_ms: 10, bytes_scale: 0.5}
  gradient_sync: SYNC
  iterations: 10
  warmup: 1
placement: dp_across_dcs
"""


@pytest.mark.parametrize("sync", [
    "{mode: diloco, inner_steps: 3, outer_dtype: int4}",
    "{mode: streaming, inner_steps: 6, fragments: 3, outer_dtype: bf16, bucket_mb: 0.05}",
    "{mode: streaming, inner_steps: 4, fragments: 2, algorithm: hierarchical}",
])
def test_the_workers_and_the_simulators_outer_ring_steps_are_the_same(tmp_path, sync):
    f = tmp_path / "agree.yaml"
    f.write_text(EXPERIMENT.replace("SYNC", sync))
    (cell,) = load_experiment(f).cells
    plan, w = plan_cell(cell), cell.experiment.workload
    frags = w.gradient_sync.outer_fragments
    numel = grad_numel(w, plan.schedule.n_stages)
    from testbed.train.outer import OuterSync  # imports torch: here, not at collection (tests/cudadevices.py)
    for slot in plan.slots:
        stages = plan.schedule.stages_of(slot.pp_rank)
        ex = types.SimpleNamespace(w=w, real=False, tr=None,
                                   ctx=types.SimpleNamespace(rank=slot.rank, dp=4))
        outer = OuterSync(ex, plan.slots, None, None, {s: numel[s] for s in stages})
        for frag in range(frags):
            inp = sync_input(plan.sim_input(), plan.slots, plan.schedule, w, numel,
                             ((frag, AFTER_LAST_ACTION),))
            for s in stages:
                assert outer.ring.steps[s * frags + frag] == inp.collectives[slot.rank][s]
                assert inp.collectives[slot.rank][s], "no steps: nothing compared"
