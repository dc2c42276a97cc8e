"""Backends that realise a Topology: ``netns`` (pyroute2 namespaces), ``mininet`` and ``remote``
(lab hosts over SSH)."""
from __future__ import annotations

import importlib

from testbed.errors import MachineError

# name → (module, class); imported on use so that a missing optional package (mininet) only
# matters to experiments that ask for it.
BACKENDS: dict[str, tuple[str, str]] = {
    "netns": ("testbed.net.backends.netns", "NetnsBackend"),
    "mininet": ("testbed.net.backends.mininet", "MininetBackend"),
    "remote": ("testbed.net.backends.remote", "RemoteBackend"),  # needs a Lab: see remote.py
}


def get_backend(name: str):
    """An instance of the named backend; raises MachineError if its packages are missing."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
    module, cls = BACKENDS[name]
    try:
        return getattr(importlib.import_module(module), cls)()
    except ImportError as e:
        raise MachineError(f"backend {name} needs {e.name}",
                           "run `bash setup.sh` (it installs every dependency)") from e
