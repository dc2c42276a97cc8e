"""Writes what this interpreter looks like from inside to state-rank<RANK>.json in the working
directory: a plain script with no testbed in mind, for comparing a rank forked from the
pre-started interpreter with one started as a process of its own."""
import json
import os
import random
import signal
import sys


def handler(sig):
    h = signal.getsignal(sig)
    return getattr(h, "__name__", str(h))


state = {
    "name": __name__,
    "argv": sys.argv,
    "path": sys.path[:3],
    "cwd": os.getcwd(),
    "environ": dict(os.environ),
    "signals": {s.name: handler(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE,
                                               signal.SIGCHLD)},
    "random": random.random(),
    "hash": hash("testbed"),
    "pipelining_imported": "torch.distributed.pipelining" in sys.modules,
    "parent": open(f"/proc/{os.getppid()}/cmdline", "rb").read().decode().split("\0"),
}
with open(f"state-rank{os.environ['RANK']}.json", "w") as f:
    json.dump(state, f)
