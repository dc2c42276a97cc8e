"""Test-suite helper: each test's CPU time, for finding what the suite spends its CPU on.

With ``TESTBED_TEST_CPU_LOG=DIR`` set, every test process (each pytest-xdist worker, or the one
process) appends one JSON line per test to ``DIR/cpu-<pid>.jsonl``: the node id, when the test's
protocol started (epoch seconds), its wall time (set-up, call and tear-down, including any wait
for the machine lock of ``tests/machineshare.py``), and its CPU seconds (user + system): the
test process's own and that of the child processes it waited for (those that ended during the
test: ranks, delay lines, CLI runs). Daemons that outlive a test, such as the stand-in sshd of
a module's lab, are counted in the test that reaps them.
``python tests/cpulog.py DIR`` prints the totals and the tests that used the most.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ENV = "TESTBED_TEST_CPU_LOG"


def _cpu_s() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@contextmanager
def cpu_logged(nodeid: str) -> Iterator[None]:
    """Append the block's wall and CPU time under ``nodeid`` when ``ENV`` names a directory."""
    directory = os.environ.get(ENV)
    if not directory:
        yield
        return
    start, (own0, children0) = time.time(), _cpu_s()
    try:
        yield
    finally:
        own1, children1 = _cpu_s()
        record = {"id": nodeid, "start": start, "wall_s": time.time() - start,
                  "own_cpu_s": own1 - own0, "children_cpu_s": children1 - children0}
        with open(Path(directory) / f"cpu-{os.getpid()}.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def records(directory: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(directory.glob("cpu-*.jsonl"))
            for line in path.read_text(encoding="utf-8").splitlines() if line]


def main(directory: Path, top: int = 30) -> None:
    rows = records(directory)
    cpu = {r["id"]: r["own_cpu_s"] + r["children_cpu_s"] for r in rows}
    by_file = Counter()
    for nodeid, seconds in cpu.items():
        by_file[nodeid.split("::")[0]] += seconds
    print(f"{len(rows)} tests, {sum(cpu.values()):.1f} s of CPU")
    print("\nfiles:")
    for name, seconds in by_file.most_common(top):
        print(f"{seconds:8.1f}  {name}")
    print("\ntests:")
    for nodeid, seconds in sorted(cpu.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{seconds:8.1f}  {nodeid}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
