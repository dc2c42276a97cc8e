"""Unshaped ring transfers sharing one machine's CPUs (``SimInput.host_bytes_per_s``,
testbed/sim/collective.py's ``HOST_HOP``): where every emulated host is a process of this
machine, n transfers at once each move min(the pair's rate, the machine's / n), as
benchmarks/loopback_pairs.py measured; elsewhere each pair keeps its own rate."""
from __future__ import annotations

import dataclasses

import pytest

from testbed.plan import plan_cell
from testbed.plan.cellplan import hosts_on_this_machine
from testbed.sim import calibration as C
from testbed.sim.engine import simulate
from testbed.spec import load_experiment

# One stage, all replicas in one DC: a single ring of dp members over unshaped veths, every
# member sending its step's chunk at once. 12 layers of hidden 512: 37.8 M parameters, a
# chunk of 151 MB / dp.
EXPERIMENT = """\
name: hostshare
topology:
  name: hostshare
  dcs:
    - {name: ha, hosts: %(hosts)s}
    - {name: hb, hosts: 1}
  inter_dc: {delay_ms: 10, rate_mbit: 400}
workload:
  model: {layers: 12, hidden: 512, heads: 8, seq_len: 128, vocab: 512}
  parallel: {pp: 1, dp: %(dp)s}
  schedule: gpipe
  microbatches: 2
  compute: {forward_ms: 10, backward_ms: 20}
placement: in_order
"""


def _input(tmp_path, dp: int, hosts: int | None = None):
    path = tmp_path / "hostshare.yaml"
    path.write_text(EXPERIMENT % {"dp": dp, "hosts": hosts or dp})
    return plan_cell(load_experiment(path).cells[0]).sim_input()


def _step_s(res, rank: int = 0) -> float:
    """The median duration of ``rank``'s ring steps (post to its bytes out)."""
    steps = sorted(sp.t1 - sp.t0 for sp in res.spans
                   if sp.kind == "ALLREDUCE_STEP" and sp.rank == rank)
    return steps[len(steps) // 2]


def _chunk_bytes(inp) -> int:
    return inp.collectives[0][0][0].numel * 4


def test_this_machines_backend_shares_its_rate_and_a_what_if_beyond_it_does_not(tmp_path):
    assert _input(tmp_path, 4).host_bytes_per_s == C.HOST_UNSHAPED_BYTES_PER_S
    topology = plan_cell(load_experiment(tmp_path / "hostshare.yaml").cells[0]).topology
    assert hosts_on_this_machine("netns", topology)
    assert not hosts_on_this_machine("remote", topology)  # the lab's hosts: machines of their own
    # 300 hosts in one DC: a what-if this backend refuses to build
    assert _input(tmp_path, 300).host_bytes_per_s is None


@pytest.mark.parametrize("dp", [2, 8])
def test_n_transfers_at_once_each_get_the_pairs_rate_or_the_machines_share(tmp_path, dp):
    inp = _input(tmp_path, dp)
    chunk = _chunk_bytes(inp)
    shared = simulate(inp)
    own = simulate(dataclasses.replace(inp, host_bytes_per_s=None, exhaustive=True))
    rate = min(C.UNSHAPED_BYTES_PER_S, C.HOST_UNSHAPED_BYTES_PER_S / dp)
    # a step is its chunk at that rate plus the receive-ready notice and software latency
    assert _step_s(shared) == pytest.approx(chunk / rate, rel=0.03), (chunk, rate)
    assert _step_s(own) == pytest.approx(chunk / C.UNSHAPED_BYTES_PER_S, rel=0.03)
    if dp == 2:  # 2 × 1.5 GB/s fit in the machine's 4.2: nothing changes
        assert _step_s(shared) == pytest.approx(_step_s(own), rel=0.01)
    else:        # 8 at once: 0.525 GB/s each
        assert _step_s(shared) > 2.5 * _step_s(own)
