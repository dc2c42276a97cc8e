"""``python -m testbed`` with, under ``--burst``, the shaper's token-bucket burst applied to
pipeline messages as testbed.sim.collective applies it to ring steps: a message that finds its
shaped hops idle passes its first bytes (up to calibration.shaper_burst_bytes of the path's
rate, refilled at the rate over the idle time) at once. Only where the path's rate is a
shaper's (a whole number of Mbit/s), not a TCP window's cap. A what-if, not testbed's model.

    PYTHONPATH=. .venv/bin/python results/leads/pipeline-burst/sim_burst.py simulate EXP --csv OUT --burst
"""
import sys
from testbed.sim import engine as E
from testbed.sim import calibration as C
from testbed.sim.iteration import TransferRequest

def _send(self, r, t, key, dst, conn):
    path, hops, _, ser = conn
    start = max(t, self.messages.known[key])
    hop_free = self.hop_free
    for h in hops:
        if hop_free[h] > start:
            start = hop_free[h]
    if self.inp.transfer is not None:
        start, path = self.inp.transfer(TransferRequest(r, dst, self.messages.described(key), t,
                                                        start, self.inp.message_bytes))
        ser = path.serialization_s(self.inp.message_bytes)
    if path.rate_bps is not None and path.hops and (path.rate_bps / 1e6).is_integer():
        idle = start - max(hop_free[h] for h in path.hops)
        burst = min(C.shaper_burst_bytes(path.rate_bps), idle * path.rate_bps / 8)
        ser = path.serialization_s(max(0.0, self.inp.message_bytes - burst))
    left = start + ser
    for h in hops:
        hop_free[h] = left
    if left > self.sent_by[r]:
        self.sent_by[r] = left
    self.arrival[key] = left + path.delay_s + C.MESSAGE_LATENCY_S
    if key in self.waiting:
        self.push(*self._wake(key))

if "--burst" in sys.argv:
    sys.argv.remove("--burst")
    E._Run._send = _send
from testbed.cli import main
sys.exit(main(sys.argv[1:]))
