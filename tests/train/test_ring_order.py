"""A ring step posts its receive before its send (testbed/train/ring.py, ``_exchange``).

gloo tells a sender that a receive is ready over the pair's one connection, behind whatever
the receiving rank has already written to it. In a hierarchical all-reduce over DCs of 3
replicas and 1 (experiments/hierarchical-unequal.yaml's shape), the lone rank of the small DC
all-reduces one piece with each rank of the big DC in turn; the second and the third posted
their steps long before. Had the lone rank sent first, its receive's notification would
follow its chunk over the 100 Mbit/s link, and the peer's chunk would leave that much late:
the first step with such a peer would take most of a serialisation longer than the second
(on experiments/hierarchical-unequal.yaml 70 ms against 55 ms; docs/facts.md). Through the
runner on the netns backend, real gloo processes, the traces of every measured iteration.
"""
from __future__ import annotations


import pandas as pd
import pytest

from runexp import run_experiment
from testbed.readout.traces import load_traces

pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.slow,
              pytest.mark.apart_from_quiet]
RATE_MBIT = 100
WIRE_PER_PAYLOAD = 1514 / 1448  # Ethernet, IP and TCP headers per full TCP segment

EXPERIMENT = f"""\
name: ringorder
topology:
  name: ringorder
  dcs: [{{name: roa, hosts: 3}}, {{name: rob, hosts: 1}}]
  inter_dc: {{delay_ms: 20, rate_mbit: {RATE_MBIT}, queue: {{bytes: 4000000}}}}
workload:
  model: {{layers: 2, hidden: 256, heads: 8, seq_len: 64, vocab: 1024}}
  parallel: {{pp: 1, dp: 4}}
  schedule: gpipe
  microbatches: 2
  compute: {{mode: emulated, forward_ms: 5, backward_ms: 10, bytes_scale: 0.25}}
  gradient_sync: {{algorithm: hierarchical}}
  iterations: 4
  warmup: 1
placement: dp_across_dcs
measure_links: false
timeout_s: 180
"""


def test_a_step_with_a_peer_that_posted_long_before_takes_no_longer_than_the_next(tmp_path):
    run = run_experiment(EXPERIMENT, tmp_path, "--quiet")
    (row,) = pd.read_csv(run / "results.csv").to_dict("records")
    assert row["status"] == "ok", row["error"]
    assert row["placement_map"] == "roa | rob | roa | roa"  # round robin, rob then full
    traces = load_traces(run / "cells" / row["cell_id"])
    lone = 1
    extra = []
    for it in range(1, 4):
        steps = [r for r in traces[lone] if r.get("kind") == "ALLREDUCE_STEP"
                 and r["iter"] == it]
        peers = [s["peer"] for s in steps]
        assert len(peers) == 6 and len(set(peers)) == 3 and peers[::2] == peers[1::2], steps
        for first, second in (steps[2:4], steps[4:6]):  # with the peers that waited
            serialisation = first["bytes"] * 8 * WIRE_PER_PAYLOAD / (RATE_MBIT * 1e6)
            extra.append(((first["t1"] - first["t0"]) - (second["t1"] - second["t0"])) / 1e9
                         / serialisation)
    # with the send first, each first step with a waiting peer took about one serialisation more
    print("EXTRA", extra)
    assert min(extra) < 0.5, extra
