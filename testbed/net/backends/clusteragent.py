"""``python -m testbed.net.backends.clusteragent SHARE.json``: holds one machine's share of a
``backend: cluster`` network for as long as the controller wants it.

Started by the controller over SSH (as root). It builds the share (``clustershare.ShareBuilder``),
writing every object into this machine's ledger before making it, prints one line
``READY <json>`` (the tunnels' MTUs) and then waits. The share is removed, and the agent exits,
when the controller closes its standard input (its SSH channel ended: teardown, or the
controller died, even by SIGKILL) or sends SIGTERM/SIGINT/SIGHUP. The agent owns the ledger,
so a ``clean`` on this machine leaves the share alone while the agent runs and removes it if
the agent itself was killed.

Exit status: 0 after a removal, 1 when the build failed (the message on stderr; what was made
is removed), 2 for a share file it cannot read.
"""
from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path

from pydantic import ValidationError

from testbed.errors import TestbedError
from testbed.net import ledger as ledgers
from testbed.net.backends.clustershare import Share, ShareBuilder
from testbed.net.ledger import Ledger

READY = "READY"


def _wait_for_end() -> None:
    """Return once stdin reaches end of file or a stop signal arrives."""
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: done.set())
    reader = threading.Thread(target=lambda: (sys.stdin.buffer.read(), done.set()), daemon=True)
    reader.start()
    while not done.wait(1.0):
        pass


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m testbed.net.backends.clusteragent SHARE.json", file=sys.stderr)
        return 2
    try:
        share = Share.model_validate_json(Path(args[0]).read_text())
    except (OSError, ValidationError) as e:
        print(f"cannot read the share {args[0]}: {e}", file=sys.stderr)
        return 2
    ledger = Ledger(share.tag, backend="cluster-share")
    builder = ShareBuilder(share)
    try:
        net = builder.build_share(ledger)
    except TestbedError as e:
        print(f"{share.machine}: {e}", file=sys.stderr)
        return 1
    try:
        print(f"{READY} {json.dumps({'tunnel_mtu': builder.tunnel_mtus})}", flush=True)
        _wait_for_end()
    finally:
        ledgers.destroy(net.ledger)
    return 0


if __name__ == "__main__":
    sys.exit(main())
