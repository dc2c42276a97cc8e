"""The simulator's fast paths (testbed/sim/rings.py; whole chunks on unshared connections in
testbed/sim/collective.py) against the full event model (``SimInput.exhaustive``): the same
predictions, to 0.1 %, on cells where both run, whether a fast path applies or not."""
from __future__ import annotations

import dataclasses

import pytest

from testbed.plan import plan_cell
from testbed.sim import predicted
from testbed.sim.engine import simulate
from testbed.spec import load_experiment

EXPERIMENT = """\
name: fast
topology:
  name: fast
  dcs:
    - {name: fa, hosts: 8%(intra_a)s}
    - {name: fb, hosts: 8}
    - {name: fc, hosts: 8}
  inter_dc: {delay_ms: 15, rate_mbit: 400}
workload:
  model: {layers: 12, hidden: 256, heads: 4, seq_len: 128, vocab: 512}
  parallel: {pp: %(pp)s, dp: %(dp)s}
  ranks_per_host: %(per_host)s
  schedule: %(schedule)s
  chunks: %(chunks)s
  microbatches: 8
  compute: {forward_ms: 10, backward_ms: 20}
  gradient_sync: {algorithm: %(algorithm)s, overlap: %(overlap)s, bucket_mb: %(bucket_mb)s}
placement: %(placement)s
"""

CASES = {
    # whole pipelines in DCs: the rings cross the WAN (shaped: the event model)
    "dp_across_dcs": dict(placement="dp_across_dcs", pp=2, dp=3),
    # stages across DCs, a stage's replicas in one DC: rings inside DCs (the fast path)
    "in_order": dict(placement="in_order", pp=3, dp=4),
    "in_order_buckets": dict(placement="in_order", pp=3, dp=4, bucket_mb=0.25),
    "in_order_after_pipeline": dict(placement="in_order", pp=3, dp=4, overlap="false"),
    "in_order_per_host": dict(placement="in_order", pp=3, dp=4, per_host=2),
    "in_order_shaped_intra": dict(placement="in_order", pp=3, dp=4,
                                  intra_a=", intra: {rate_mbit: 2000, delay_ms: 0.5}"),
    # delayed but not rate-limited: no FIFO, so still the fast path, with delays in it
    "in_order_delayed_intra": dict(placement="in_order", pp=3, dp=4,
                                   intra_a=", intra: {delay_ms: 0.7}"),
    "in_order_hierarchical": dict(placement="in_order", pp=3, dp=4, algorithm="hierarchical"),
    # two virtual stages per rank share each ring connection: not alone
    "interleaved": dict(placement="in_order", pp=2, dp=4, chunks=2, schedule="interleaved_1f1b"),
}
DEFAULTS = dict(placement="in_order", pp=2, dp=2, per_host=1, schedule="1f1b", chunks=1,
                algorithm="ring", overlap="true", bucket_mb=0, intra_a="")


def _plan(tmp_path, **kw):
    path = tmp_path / "fast.yaml"
    text = EXPERIMENT % {**DEFAULTS, **kw}
    path.write_text(text.replace(", bucket_mb: 0}", "}"))
    return plan_cell(load_experiment(path).cells[0])


def _both(plan, host_shared: bool = False):
    """The fast and the full model of ``plan``. By default the hosts are machines of their
    own (a lab's): with every host a process of one machine (this backend's own inputs), all
    unshaped ring transfers share its rate, so no ring is timed at once
    (tests/sim/test_host_sharing.py)."""
    inp = plan.sim_input()
    if not host_shared:
        inp = dataclasses.replace(inp, host_bytes_per_s=None)
    return simulate(inp), simulate(dataclasses.replace(inp, exhaustive=True))


@pytest.mark.parametrize("host_shared", [False, True], ids=["own-machines", "one-machine"])
@pytest.mark.parametrize("case", CASES)
def test_fast_paths_agree_with_the_full_event_model(tmp_path, case, host_shared):
    fast, full = _both(_plan(tmp_path, **CASES[case]), host_shared)
    pf, pe = predicted(fast), predicted(full)
    assert pf.keys() == pe.keys()
    for k, v in pe.items():
        if isinstance(v, float) and v:
            assert abs(pf[k] - v) <= 1e-3 * abs(v), (k, pf[k], v)
        else:
            assert pf[k] == v, (k, pf[k], v)
    # the same sums, but a chunk sent whole adds its time once, not quantum by quantum
    assert fast.busy_s == pytest.approx(full.busy_s, rel=1e-9)
    assert fast.wait_s == pytest.approx(full.wait_s, rel=1e-9, abs=1e-12)


def test_a_ring_inside_a_dc_is_timed_at_once(tmp_path):
    """The case the fast path is for: its steps are not events (one record per rank instead
    of one per step), and the all-reduce is still there, as long as the full model's."""
    fast, full = _both(_plan(tmp_path, **CASES["in_order"]))
    steps = [sp for sp in fast.spans if sp.kind == "ALLREDUCE_STEP"]
    assert len(steps) == 12  # one per rank
    assert len([sp for sp in full.spans if sp.kind == "ALLREDUCE_STEP"]) == 12 * 2 * 3
    assert predicted(fast)["predicted_allreduce_hidden_s"] > 0


def test_shared_connections_keep_the_event_model(tmp_path):
    """Two virtual stages per rank: their chunks interleave on one connection, so every
    step stays an event."""
    fast, full = _both(_plan(tmp_path, **CASES["interleaved"]))
    count = len([sp for sp in fast.spans if sp.kind == "ALLREDUCE_STEP"])
    assert count == len([sp for sp in full.spans if sp.kind == "ALLREDUCE_STEP"]) > 8


@pytest.mark.parametrize("case", ["dp_across_dcs", "in_order", "interleaved"])
def test_spans_come_by_rank_then_start(tmp_path, case):
    """The result's spans are sorted rank by rank; within a rank by start, ties in the order
    they were made (as one stable sort by (rank, start) of the made order would give)."""
    res = simulate(_plan(tmp_path, **CASES[case]).sim_input())
    keys = [(sp.rank, sp.t0) for sp in res.spans]
    assert keys == sorted(keys) and len({sp.rank for sp in res.spans}) > 1


@pytest.mark.parametrize("case", ["dp_across_dcs", "interleaved", "pipeline_only"])
def test_ranks_run_ahead_to_the_same_timeline(tmp_path, case):
    """A rank runs its own actions one after another without the event queue, up to a send
    onto a shared shaped hop or a receive still in flight: the same spans to the last float as
    every action an event, where no ring is timed at once (a ring across the WAN, two stages
    per rank, no replicas), with far fewer events."""
    kw = CASES.get(case, dict(placement="in_order", pp=3, dp=1))
    fast, full = _both(_plan(tmp_path, **kw))
    assert fast.spans == full.spans
    assert (fast.span_s, fast.busy_s, fast.wait_s) == (full.span_s, full.busy_s, full.wait_s)
    assert fast.peak_inflight_per_stage == full.peak_inflight_per_stage
    # the all-reduces' quanta stay events; a pipeline alone is mostly its ranks' own runs
    assert fast.events < full.events / (2 if case == "pipeline_only" else 1)


def test_replicas_sharing_a_wan_link_keep_its_order(tmp_path):
    """Four replicas' pipelines cross the same shaped WAN directions: each send onto them
    still waits for its turn in time order, so the fast run queues them as the full one does
    (the same spans; sending them as each rank reaches them would reorder the FIFO)."""
    plan = _plan(tmp_path, placement="in_order", pp=3, dp=4, overlap="false")
    inp = plan.sim_input()
    inp.collectives = {}  # the pipelines alone on the WAN
    fast, full = simulate(inp), simulate(dataclasses.replace(inp, exhaustive=True))
    assert fast.spans == full.spans
    assert fast.events < full.events / 2


def test_the_garbage_collector_runs_again_after_a_simulation(tmp_path):
    import gc

    from testbed.sim.iteration import Deadlock

    inp = _plan(tmp_path, **CASES["in_order"]).sim_input()
    simulate(inp)
    assert gc.isenabled()
    inp.schedule.actions[0].reverse()  # receives before the sends they wait for
    with pytest.raises(Deadlock):
        simulate(inp)
    assert gc.isenabled()
