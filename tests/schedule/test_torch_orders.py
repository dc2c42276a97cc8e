"""Our generators against torch.distributed.pipelining 2.13's own per-rank compute orders.

torch computes its orders in schedule constructors that need live pipeline stages; these tests
call the order-building methods on bare instances with just the attributes they read (private
API: torch is pinned to 2.13.0 in pyproject.toml, and these tests say so when it moves).
"""
from __future__ import annotations

import pytest

from testbed.schedule.generators import generate
from testbed.schedule.lower import lower

COMPUTE = {"F": "F", "B": "B", "I": "I", "W": "W"}


def _torch_rows(order: dict) -> list[list[str]]:
    """Compute actions per rank as 'stageKINDmb' strings; overlapped F+B pairs flattened in
    their order, idle slots and communication/sharding actions left out."""
    rows = []
    for rank in sorted(order):
        row = []
        for a in order[rank]:
            if a is None:
                continue
            subs = a.sub_actions if a.computation_type.value == "OVERLAP_F_B" else [a]
            for sub in subs:
                kind = COMPUTE.get(sub.computation_type.value)
                if kind:
                    row.append(f"{sub.stage_index}{kind}{sub.microbatch_index}")
        rows.append(row)
    return rows


def _bare(name: str, **attrs):
    """An instance of torch's schedule class ``name`` with just ``attrs``. torch is imported
    here, not at collection: every pytest-xdist worker collects this module, and importing
    torch's pipelining cost each of them about 2 s of CPU at the run's start."""
    from torch.distributed.pipelining import schedules
    obj = object.__new__(getattr(schedules, name))
    for k, v in attrs.items():
        setattr(obj, k, v)
    return obj


def _per_rank(obj, pp: int) -> dict:
    return {r: obj._calculate_single_rank_operations(r) for r in range(pp)}


def test_torch_is_the_version_these_orders_were_checked_against():
    import torch
    assert torch.__version__.startswith("2.13."), "re-check the orders against the new torch"


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 16)])
def test_gpipe_matches_torch(pp, m):
    obj = _bare("ScheduleGPipe", _num_stages=pp, _n_microbatches=m)
    assert generate("gpipe", pp, m).to_rows() == _torch_rows(obj._get_pipeline_order())


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 16)])
def test_1f1b_matches_torch_except_its_last_rank_numbering(pp, m):
    obj = _bare("Schedule1F1B", _num_stages=pp, _n_microbatches=m)
    theirs, ours = _torch_rows(obj._get_pipeline_order()), generate("1f1b", pp, m).to_rows()
    assert ours[:-1] == theirs[:-1]
    # torch 2.13 numbers the last rank's forwards 1…m while its backwards run 0…m−1, so its
    # exported order names a forward of a microbatch that does not exist (docs/facts.md). Ours keeps
    # the same F/B alternation with both numbered 0…m−1.
    def mbs(row, kind):
        return [int(a.split(kind)[1]) for a in row if kind in a]
    assert mbs(theirs[-1], "F") == list(range(1, m + 1))
    assert mbs(theirs[-1], "B") == list(range(m)) == mbs(ours[-1], "B") == mbs(ours[-1], "F")
    assert [a[1] for a in theirs[-1]] == [a[1] for a in ours[-1]]


@pytest.mark.parametrize("pp,m,v", [(2, 4, 2), (4, 8, 2), (4, 16, 2), (4, 8, 3), (2, 6, 2)])
def test_interleaved_1f1b_matches_torch(pp, m, v):
    obj = _bare("ScheduleInterleaved1F1B", pp_group_size=pp, _n_microbatches=m, n_local_stages=v,
                microbatches_per_round=m // max(1, m // pp))
    assert generate("interleaved_1f1b", pp, m, v).to_rows() == _torch_rows(_per_rank(obj, pp))


@pytest.mark.parametrize("pp,m,v", [(2, 4, 2), (4, 8, 2), (4, 16, 2), (4, 8, 3)])
def test_zb_h1_matches_torch_interleaved_zero_bubble(pp, m, v):
    obj = _bare("ScheduleInterleavedZeroBubble", pp_group_size=pp, _n_microbatches=m,
                n_local_stages=v, microbatches_per_round=m // max(1, m // pp))
    assert generate("zb_h1", pp, m, v).to_rows() == _torch_rows(_per_rank(obj, pp))


@pytest.mark.parametrize("pp,m", [(2, 3), (2, 8), (4, 7), (4, 8), (4, 16)])
def test_zbv_matches_torch(pp, m):
    obj = _bare("ScheduleZBVZeroBubble", pp_group_size=pp, _n_microbatches=m, num_stages=2 * pp)
    assert generate("zbv", pp, m, 2).to_rows() == _torch_rows(_per_rank(obj, pp))


@pytest.mark.parametrize("pp,m", [(2, 4), (2, 8), (4, 8), (4, 16)])
def test_dualpipev_matches_torch(pp, m):
    obj = _bare("ScheduleDualPipeV", pp_group_size=pp, _n_microbatches=m)
    assert generate("dualpipev", pp, m, 2).to_rows() == _torch_rows(_per_rank(obj, pp))


@pytest.mark.parametrize("name,pp,m,v", [("interleaved_1f1b", 4, 8, 2), ("zb_h1", 4, 8, 2),
                                         ("zbv", 4, 8, 2), ("dualpipev", 4, 8, 2)])
def test_every_stage_runs_each_microbatch_forward_and_backward_once(name, pp, m, v):
    s = generate(name, pp, m, v)
    for r, acts in enumerate(s.actions):
        for stage in s.stages_of(r):
            for mb in range(m):
                kinds = sorted(a.kind.value for a in acts if a.stage == stage and a.microbatch == mb)
                assert kinds in (["B", "F"], ["F", "I", "W"]), (name, r, stage, mb, kinds)
    lower(s)  # lowering needs every neighbour stage to exist
