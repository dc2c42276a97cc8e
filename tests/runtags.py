"""What a run left on this machine, found by the run's own tags.

Tests run side by side (pytest-xdist), and several use DCs of the same names, so a test asks
only about the networks its own run built: the tags its ``run.log`` names, and the tags whose
ledger names its runner as owner (a runner killed while building never logged that tag).
"""
from __future__ import annotations

import re
from pathlib import Path

from testbed.net import ledger as ledgers

TAG_IN_LOG = re.compile(r"tag (tb[0-9a-f]{6})\b")


def logged_tags(run_dir: Path) -> set[str]:
    """The tags of every network a run directory's ``run.log`` says was built."""
    return {t for log in Path(run_dir).rglob("run.log")
            for t in TAG_IN_LOG.findall(log.read_text(errors="replace"))}


def owned_tags(pid: int) -> set[str]:
    """The tags of the live ledgers whose owner is process ``pid``."""
    out = set()
    for path in ledgers.LEDGER_DIR.glob("tb*.json") if ledgers.LEDGER_DIR.is_dir() else []:
        try:
            led = ledgers.Ledger.load(path)
        except (OSError, ValueError, TypeError):
            continue
        if led.owner_pid == pid:
            out.add(led.tag)
    return out


def left_behind(tags: set[str]) -> list[str]:
    """Namespaces and ledger files of ``tags`` that still exist."""
    spaces = [n for n in ledgers.tagged_namespaces() if ledgers.tag_of(n) in tags]
    files = [p.name for t in tags if (p := ledgers.LEDGER_DIR / f"{t}.json").exists()]
    return spaces + files
