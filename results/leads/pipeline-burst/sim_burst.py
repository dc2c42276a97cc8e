"""``python -m testbed`` with, under ``--burst``, the shaper's token-bucket burst applied to
pipeline messages as testbed.sim.collective applies it to ring steps: a message that finds its
shaped hops idle passes its first bytes (up to calibration.shaper_burst_bytes of the path's
rate, refilled at the rate over the idle time) at once. Only where the path's rate is a
shaper's (a whole number of Mbit/s), not a TCP window's cap. A what-if, not testbed's model.

    PYTHONPATH=. .venv/bin/python results/leads/pipeline-burst/sim_burst.py simulate EXP --csv OUT --burst
"""
import sys

from testbed.sim import calibration as C
from testbed.sim import engine as E

_engine_send = E._Run._send


def _send(self, r, t, key, dst, conn):
    """The engine's send, with the message's serialisation shortened by the burst its shaped
    hops let through at once when they were idle before it starts (not on a per-transfer
    network: testbed.optical sets its own path)."""
    path, hops, shared, _ = conn
    if (path.rate_bps is not None and path.hops and (path.rate_bps / 1e6).is_integer()
            and self.inp.transfer is None):
        start = max([t, self.messages.known[key]] + [self.hop_free[h] for h in hops])
        idle = start - max(self.hop_free[h] for h in path.hops)
        burst = min(C.shaper_burst_bytes(path.rate_bps), idle * path.rate_bps / 8)
        conn = (path, hops, shared, path.serialization_s(max(0.0, self.inp.message_bytes - burst)))
    _engine_send(self, r, t, key, dst, conn)


if "--burst" in sys.argv:
    sys.argv.remove("--burst")
    E._Run._send = _send
from testbed.cli import main  # noqa: E402
sys.exit(main(sys.argv[1:]))
