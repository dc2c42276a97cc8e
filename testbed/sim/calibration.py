"""Fixed costs of the project's executor on this machine, which the simulator adds to the
modelled compute and link times.

Measured on this project's 2-core Debian 12 VM (other work running beside it) with
``.venv/bin/python benchmarks/bench_sim.py --calibrate``, which runs the real workers over
loopback (gloo, emulated compute, 2 KB activations) and reads the per-action traces; the values
are the middle of the medians of three runs: gpipe on 2 ranks, 1f1b and zbv on 4 ranks
(several hundred actions each); the three medians are given beside each constant.
They are small next to millisecond compute, so a few tens of µs of error here move a
prediction by well under 1 %. Re-run the calibration on other machines.

The calibration now prints means (``testbed.readout.executorcosts``: the simulator adds these
costs up, so the slow tail counts), 1.4–2.3× the medians below on a later day
(``results/benchmarks/bench_sim_calibrate.md``). The constants are still the medians: moving
them moves every prediction by about 1 % and the committed predictions would need re-running.
"""
from __future__ import annotations

# time.sleep(t) in emulated compute returns this much late (timer slack, wake-up); the trace
# counts it as compute. Medians 117 / 126 / 141 µs.
SLEEP_OVERSHOOT_S = 126e-6
# Between two actions of one rank (Python dispatch, tracing). Medians 14 / 11 / 14 µs.
ACTION_GAP_S = 14e-6
# dist.isend of a small tensor holds the sending rank this long (traced as comm, i.e. idle).
# Medians 232 / 205 / 256 µs.
SEND_CALL_S = 232e-6
# From the start of isend to the receiver's wait returning, for a small tensor on an unshaped
# path, when the receiver was already waiting. Medians 323 / 280 / 357 µs.
MESSAGE_LATENCY_S = 323e-6
# From the iteration's start to its first action, per receive posted then (irecv of every
# RECV in the rank's list). Medians 70 / 44 / 64 µs.
POST_RECV_S = 64e-6
# gloo's throughput between two processes on an unshaped path, bytes/s: 4 MiB messages on
# loopback took 3.06 ms from isend to the receiver (median), 0.32 ms of it fixed: 1.53 GB/s.
# Not measured over veth (namespaces need root); raw veth TCP is about 2 GB/s (docs/facts.md).
# Also the rate between two ranks of one host (workload.ranks_per_host > 1, sim.paths.SAME_HOST):
# their bytes go through that host's loopback path, as in this measurement.
UNSHAPED_BYTES_PER_S = 1.5e9
# What every unshaped transfer together moves when all emulated hosts are processes of one
# machine (SimInput.host_bytes_per_s): their bytes are copied by the same CPUs. Pairs of
# processes sending 27 MB messages over loopback at once (results/benchmarks/loopback_pairs.md,
# this project's 2-core machine) moved 3.61 GB/s together as two pairs, 4.24 as four and 4.13
# as eight: 1.06 and 0.52 GB/s per pair, where each pair alone at UNSHAPED_BYTES_PER_S would
# make 6.0 and 12.0 together.
HOST_UNSHAPED_BYTES_PER_S = 4.2e9
# TCP over Ethernet: 1448 payload bytes (MSS with timestamps) per 1514 bytes that htb/tbf count.
WIRE_BYTES_PER_PAYLOAD_BYTE = 1514 / 1448
# A window-limited TCP connection moves about this fraction of its socket buffer limit
# (topology.tcp_buffer_max_mb) per round trip: benchmarks/bench_transport.py sent 8 MiB over
# a 40 ms RTT path with 0.25 MiB buffers in 1.715 s on one connection (0.187 MiB per round
# trip, 0.75 of the buffer) and in 0.455 s on four (0.70 each).
TCP_WINDOW_PER_BUFFER = 0.75
# The shapers' token buckets (htb, tbf: testbed.net.shaping.tc.burst_bytes) are this deep: 1 ms
# of the rate, at least two GSO packets. A transfer that finds its link idle long enough to
# refill the bucket gets that many bytes through at once. The all-reduce's ring steps do (each
# waits one delay for its receive-ready notification); measured on a ring of 3 over 10 ms,
# 200 Mbit/s links: 0.71 MB steps took 42.7 ms, against 44.6 ms modelled with the burst and
# 49.6 ms without (tests/train/test_low_communication.py's cell). Pipeline messages do too:
# one sent after 100 ms of idle to a receive posted before, 262 KB at 100 Mbit/s took 9.64 ms
# against 10.96 ms with the burst and 21.93 ms without, 1 MiB at 219 Mbit/s 35.05 ms against
# 35.04 and 40.05 (results/leads/pipeline-burst/drain-posted.txt). A path whose rate is a TCP
# window's cap gets none (testbed.sim.paths).
SHAPER_BURST_S = 0.001
SHAPER_BURST_MIN_BYTES = 2 * 65536


def shaper_burst_bytes(rate_bps: float) -> float:
    """Depth of a shaper's token bucket at ``rate_bps``."""
    return max(rate_bps / 8 * SHAPER_BURST_S, SHAPER_BURST_MIN_BYTES)
