"""Results owned by the user who ran sudo.

``run`` needs root, so it is usually started as ``sudo … python -m testbed run``: everything it
writes would belong to root, and the user could not delete or edit their own results without
root. When the process is root and sudo's ``SUDO_UID``/``SUDO_GID`` (``SUDO_USER``) say who
asked, the run directory (``testbed.runner.store.RunStore``) gives what it writes to that user:
the directories it created (the run directory and any parents it made), results.csv, the cell
directories and everything in them, run.log, summary.md and plots. Directories that existed
before (``--results /tmp``) are left as they were. Symbolic links are changed themselves,
never followed.
"""
from __future__ import annotations

import logging
import os
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

log = logging.getLogger(__name__)


@dataclass
class Owner:
    """The user (and group) a run's files are given to."""

    uid: int
    gid: int
    name: str
    _warned: bool = False

    @classmethod
    def from_sudo(cls, environ: Mapping[str, str] | None = None) -> "Owner | None":
        """The user who ran sudo, when this process is root and sudo said who (SUDO_UID, and
        SUDO_GID or the user's primary group); None otherwise (not root, not under sudo, or
        sudo from root)."""
        env = os.environ if environ is None else environ
        if os.geteuid() != 0 or not env.get("SUDO_UID"):
            return None
        try:
            uid = int(env["SUDO_UID"])
            gid = int(env["SUDO_GID"]) if env.get("SUDO_GID") else pwd.getpwuid(uid).pw_gid
        except (ValueError, KeyError):
            log.warning("SUDO_UID=%r SUDO_GID=%r name no user: results stay owned by root",
                        env.get("SUDO_UID"), env.get("SUDO_GID"))
            return None
        if uid == 0:
            return None
        return cls(uid, gid, env.get("SUDO_USER") or str(uid))

    def give(self, path: Path, recursive: bool = True) -> None:
        """Give ``path`` (and, when ``recursive``, everything beneath it) to this user. A
        failure (a file system that keeps root's ownership) is a warning, once: the results
        are written, only their owner is not the user's."""
        path = Path(path)
        try:
            if not os.path.lexists(path):
                return
            os.lchown(path, self.uid, self.gid)
            if recursive and path.is_dir() and not path.is_symlink():
                for top, dirs, files in os.walk(path, onerror=_raise):
                    for name in dirs + files:
                        os.lchown(os.path.join(top, name), self.uid, self.gid)
        except OSError as e:
            if not self._warned:
                self._warned = True
                log.warning("cannot give %s to %s: %s; results stay owned by root",
                            e.filename or path, self.name, e.strerror)


def _raise(e: OSError) -> None:
    raise e


def missing_dirs(path: Path) -> list[Path]:
    """``path`` and its ancestors that do not exist yet, outermost first: what a
    ``mkdir(parents=True)`` of ``path`` creates."""
    out = []
    for p in (Path(path), *Path(path).parents):
        if os.path.lexists(p):
            break
        out.append(p)
    return out[::-1]
