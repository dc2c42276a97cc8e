"""A controller in the loop (``controller:``): between the iterations of a running cell it
reads what every rank traced of the iteration just ended, lets the policy decide the slots of
each driven link direction (``testbed.optical.control``) and sets the rates through the shaper.

The initial allocation is set before the workers start. Then, once every rank's trace holds
iteration k (each rank flushes its trace when an iteration ends), the receivers' waits on the
transfers that crossed each direction in iteration k are summed, the policy decides, and the
links whose rates changed are updated (``Shaper.update`` reads them back); the change is meant
for iteration k + 1, which starts at the common start the ranks agree on after k (a margin of
tens of ms). Each decision is logged with its monotonic times (the traces' clock) and the
rates the shaper then has in force; ``testbed.readout.controlled`` tells from the traces
whether it landed before iteration k + 1 started, and flags that iteration if not.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from testbed.cell.celldir import CellDir
from testbed.net.shaping.interface import Shaper
from testbed.optical.control import Allocation, direction
from testbed.plan import CellPlan
from testbed.readout.controlled import controller_readout
from testbed.runner.store import atomic_write
from testbed.runner.tracewatch import IterationWatch

log = logging.getLogger(__name__)
POLL_S = 0.002
# the file in the cell directory that releases iteration N to the ranks (testbed.train.sync)
GATE_PREFIX = "controller-gate-"


class LinkController:
    """Plays ``plan.experiment.controller`` on ``shaper`` while the cell's ranks run."""

    def __init__(self, shaper: Shaper, plan: CellPlan, cell_dir: CellDir):
        self.shaper, self.plan = shaper, plan
        spec = plan.experiment.controller
        self.links = [lk for lk in plan.links if spec.links is None or lk.name in spec.links]
        self.alloc = Allocation(spec, {lk.name: (direction(lk.name, lk.a, lk.b),
                                                 direction(lk.name, lk.b, lk.a))
                                       for lk in self.links})
        self.root = Path(cell_dir.root)
        self.traces = {s.rank: Path(cell_dir.trace(s.rank)) for s in plan.slots}
        self.records: dict[int, list[dict]] = {r: [] for r in self.traces}
        self.offsets = {r: 0 for r in self.traces}
        self.watches = {r: IterationWatch(p) for r, p in self.traces.items()}
        self.dc = {s.rank: s.dc for s in plan.slots}
        self.link_of = {frozenset((lk.a, lk.b)): lk.name for lk in self.links}
        self.log: list[dict] = []
        self.error: Exception | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Set the initial allocation (for iteration 0), then follow the iterations."""
        self._apply(-1, {})
        self._thread = threading.Thread(target=self._follow, name="link-controller",
                                        daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        last = self.plan.experiment.workload.iterations - 1
        handled = 0
        while not self._stop.wait(POLL_S):
            done = min(w.done() for w in self.watches.values())
            if done > handled and done <= last:
                handled = done
                try:
                    self._apply(done - 1, self.waits(done - 1))
                except Exception as e:  # handed to the runner in stop()
                    self.error = e
                    return
                # the ranks wait for this before agreeing on iteration ``done``'s start
                (self.root / f"{GATE_PREFIX}{done}").touch()

    def waits(self, it: int) -> dict[str, float]:
        """Seconds receivers waited in iteration ``it`` on transfers crossing each driven
        link direction."""
        out: dict[str, float] = {}
        for rank, path in self.traces.items():
            for r in self._new_records(rank, path):
                if (r.get("type") == "action" and r["iter"] == it and r["cat"] == "wait"
                        and r["kind"] in ("RECV_F", "RECV_B") and r.get("peer") is not None):
                    for d in self._crossed(r["peer"], rank):
                        out[d] = out.get(d, 0.0) + (r["t1"] - r["t0"]) / 1e9
        return out

    def _new_records(self, rank: int, path: Path) -> list[dict]:
        """The records rank ``rank`` appended since the last call (whole lines only)."""
        with open(path, "rb") as f:
            f.seek(self.offsets[rank])
            data = f.read()
        whole = data[:data.rfind(b"\n") + 1]
        self.offsets[rank] += len(whole)
        return [json.loads(line) for line in whole.splitlines() if line.strip()]

    def _crossed(self, src: int, dst: int) -> list[str]:
        return [direction(self.link_of[frozenset(hop)], *hop)
                for hop in self.plan.paths.route(self.dc[src], self.dc[dst])
                if frozenset(hop) in self.link_of]

    def _apply(self, after: int, waits: dict[str, float]) -> None:
        before = dict(self.alloc.granted) if after >= 0 else {}
        granted = self.alloc.decide(waits) if after >= 0 else dict(self.alloc.granted)
        t_asked = time.monotonic_ns()
        changed = [lk for lk in self.links
                   if any(before.get(d) != granted[d] for d in self.alloc.pairs[lk.name])]
        for lk in changed:
            ab, ba = self.alloc.pairs[lk.name]
            self.shaper.update(lk.index,
                               lk.a_to_b.model_copy(update={"rate_mbit": self.alloc.rate_mbit(ab)}),
                               lk.b_to_a.model_copy(update={"rate_mbit": self.alloc.rate_mbit(ba)}))
        self.log.append({"after_iteration": after, "for_iteration": after + 1,
                         "waits_s": {d: round(w, 6) for d, w in sorted(waits.items())},
                         "slots": dict(granted), "blocked": dict(self.alloc.blocked),
                         "rate_mbit": {d: self.alloc.rate_mbit(d) for d in granted},
                         "in_force_mbit": self._in_force(), "changed": [lk.name for lk in changed],
                         "asked_ns": t_asked, "applied_ns": time.monotonic_ns()})
        if changed:
            log.info("controller after iteration %d: %s", after, granted)

    def _in_force(self) -> dict[str, float | None]:
        """The rates the shaper has in force now, per driven direction (read back)."""
        out = {}
        for lk in self.links:
            now = self.shaper.in_force(lk.index)
            ab, ba = self.alloc.pairs[lk.name]
            out[ab] = None if now is None else now[0].rate_mbit
            out[ba] = None if now is None else now[1].rate_mbit
        return out

    def stop(self) -> None:
        """End it; raises the error a decision met (once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        err, self.error = self.error, None
        if err is not None:
            raise err


def start_controller(shaper: Shaper, plan: CellPlan, cell_dir: CellDir,
                     stack: ExitStack) -> LinkController | None:
    """The cell's controller, started (its initial rates set) and stopped when ``stack``
    closes; None without ``controller:``."""
    if plan.experiment.controller is None:
        return None
    ctl = LinkController(shaper, plan, cell_dir)
    ctl.start()
    stack.callback(ctl.stop)
    return ctl


def controller_columns(ctl: LinkController | None, plan: CellPlan,
                       cell_dir: CellDir) -> dict:
    """The row's controller columns, with ``controller.json`` (the log) and
    ``controller.csv`` (per iteration) written into the cell directory; {} without one."""
    if ctl is None:
        return {}
    root = Path(cell_dir.root)
    for gate in root.glob(f"{GATE_PREFIX}*"):
        gate.unlink()
    atomic_write(root / "controller.json", json.dumps(ctl.log, indent=1).encode())
    cols, table = controller_readout(plan, root, ctl.log, ctl.alloc.pairs)
    atomic_write(root / "controller.csv", table)
    return cols
