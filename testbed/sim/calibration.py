"""Fixed costs of the project's executor on this machine, which the simulator adds to the
modelled compute and link times.

Measured on this project's 2-core Debian 12 VM (other work running beside it) with
``.venv/bin/python benchmarks/bench_sim.py --calibrate``, which runs the real workers over
loopback (gloo, emulated compute, 2 KB activations) and reads the per-action traces; the values
are medians over gpipe on 2 ranks, 1f1b and zbv on 4 ranks (several hundred actions each).
They are small next to millisecond compute, so a few tens of µs of error here move a
prediction by well under 1 %. Re-run the calibration on other machines.
"""
from __future__ import annotations

# time.sleep(t) in emulated compute returns this much late (timer slack, wake-up); the trace
# counts it as compute. Medians 119 / 130 / 144 µs in the three runs.
SLEEP_OVERSHOOT_S = 130e-6
# Between two actions of one rank (Python dispatch, tracing). Medians 11 / 11 / 13 µs.
ACTION_GAP_S = 11e-6
# dist.isend of a small tensor holds the sending rank this long (traced as comm, i.e. idle).
# Medians 212 / 223 / 217 µs.
SEND_CALL_S = 215e-6
# From the start of isend to the receiver's wait returning, for a small tensor on an unshaped
# path, when the receiver was already waiting. Medians 0.32 / 0.25 / 0.26 ms.
MESSAGE_LATENCY_S = 260e-6
# irecv posted for every RECV at the start of each iteration, per receive.
POST_RECV_S = 25e-6
# gloo's throughput between two processes on an unshaped path (loopback or veth), bytes/s.
UNSHAPED_BYTES_PER_S = 1.0e9
# TCP over Ethernet: 1448 payload bytes (MSS with timestamps) per 1514 bytes that htb/tbf count.
WIRE_BYTES_PER_PAYLOAD_BYTE = 1514 / 1448
