"""Mininet's own classes as the ``mininet`` backend (``testbed.net.backends.mininet``) uses
them: nodes whose every process is in the ledger the moment it exists, the objects of one
network (kept for talking to its shells and ending them), an argv run through a node's shell,
and the wait for dead namespaces' switch ports to vanish.
"""
from __future__ import annotations

import logging
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from mininet.node import Host
from mininet.nodelib import LinuxBridge

from testbed.errors import CommandError
from testbed.net.ledger import Ledger
from testbed.net.network import Node

log = logging.getLogger(__name__)

# Dead namespaces' veths vanish asynchronously (about 40 ms for 68 namespaces here); after
# this long the remaining ports are deleted one by one instead.
PORTS_GONE_S = 5.0
POLL_S = 0.005
_RC = re.compile(r"__rc=(\d+)\s*$")


class Recorded:
    """Mixin for Mininet nodes: every process Mininet spawns for the node (its shell first)
    goes into the ledger the moment it exists, so ``clean`` finds it after a SIGKILL."""

    ledger: Ledger

    def _popen(self, cmd, **params):
        proc = super()._popen(cmd, **params)
        self.ledger.add_process(proc.pid)
        return proc


class RecordedHost(Recorded, Host):
    def __init__(self, name: str, ledger: Ledger):
        self.ledger = ledger
        Host.__init__(self, name)


class RecordedBridge(Recorded, LinuxBridge):
    def __init__(self, name: str, dpid: str, ledger: Ledger):
        self.ledger = ledger
        LinuxBridge.__init__(self, name, dpid=dpid, inNamespace=False)


@dataclass
class Parts:
    """Mininet's objects for one network, kept for talking to its shells and ending them."""

    switches: list[LinuxBridge] = field(default_factory=list)
    nodes: list[Host] = field(default_factory=list)
    routers: dict[str, Host] = field(default_factory=dict)
    switch_nodes: dict[str, Node] = field(default_factory=dict)

    def terminate(self) -> None:
        """Mininet's ``terminate`` for every node (SIGHUP to its shell, close its pty, reap it);
        goes on past failures."""
        for node in reversed(self.nodes + self.switches):
            try:
                node.terminate()
            except Exception as e:  # the ledger still lists the pid: destroy stops it
                log.warning("mininet: ending %s failed: %s", node, e)
        self.switches, self.nodes = [], []


def _exists(ifname: str) -> bool:
    """Whether a root-namespace interface exists (this process's /sys is the root's)."""
    return Path(f"/sys/class/net/{ifname}").exists()


def await_ports_gone(ledger: Ledger, bridges: set[str], timeout_s: float) -> None:
    """Wait for the kernel to remove the switch ports of dead namespaces, then drop every
    vanished name from the ledger so that ``destroy`` deletes only what is left."""
    deadline = time.monotonic() + timeout_s
    while any(_exists(n) for n in ledger.root_links if n not in bridges):
        if time.monotonic() > deadline:
            log.warning("mininet %s: switch ports outlived their namespaces; deleting them",
                        ledger.tag)
            break
        time.sleep(POLL_S)
    ledger.root_links = [n for n in ledger.root_links if _exists(n)]
    ledger.save()


def shell_run(node: Host, argv: list[str]) -> str:
    """Run argv through the node's Mininet shell (quoted, no shell syntax from configuration);
    returns its output; raises CommandError on a non-zero exit."""
    out = node.cmd(shlex.join(argv) + "; echo __rc=$?")
    m = _RC.search(out)
    rc = int(m.group(1)) if m else -1
    if rc != 0:
        raise CommandError(argv, rc, out, node.name)
    return out[:m.start()]
