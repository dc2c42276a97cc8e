"""How far a running cell has got: the iterations rank 0 has finished, read from its trace as
it grows (the worker flushes the trace at the end of every iteration). Used to time
``at_iteration`` link steps; it needs the trace on this machine while the run goes on
(``Backend.traces_live``: a lab host's trace arrives only when its worker exits)."""
from __future__ import annotations

import json
from pathlib import Path

# an iteration record as the worker writes it (compact JSON, type first), and an optimizer
# step's (a program's iterations where it has no iteration records)
_ITER_PREFIX = b'{"type":"iter"'
_OPT_PREFIX = b'{"type":"opt"'


class IterationWatch:
    """``done()``: the number of iterations whose ``iter`` record is in the trace at ``path``,
    or of ``opt`` records (optimizer steps) where there are more (0 while the file does not
    exist). Reads only what was appended since the last call."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._offset = 0
        self._partial = b""
        self._done = 0
        self._steps = 0

    def done(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return self._done
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if line.startswith(_ITER_PREFIX):
                self._done = max(self._done, json.loads(line)["iter"] + 1)
            elif line.startswith(_OPT_PREFIX) and json.loads(line).get("opt", 0) == 0:
                # the first optimizer to step: a DiLoCo program's outer optimizer, which steps
                # once per H inner steps, ends no iteration (testbed.readout.traces)
                self._steps += 1
        return max(self._done, self._steps)
