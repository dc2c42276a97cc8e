"""Run a callback once a module has been imported, whenever the program imports it.

The instrument patches torch.distributed.pipelining, but importing it before the program runs
changes the program: PyTorch's DDP tutorial then hung at exit in 4 of 8 runs under torchrun
on loopback (0 of 8 when the same program ran through runpy alone, or after importing only
torch and torch.optim). So the patch waits until the program imports the package itself.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Callable


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds ``name`` with the other finders and wraps its loader so ``then`` runs once the
    module has executed."""

    def __init__(self, name: str, then: Callable[[], None]):
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one module, once
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader, then = spec.loader, self.then

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                then()

        spec.loader = _Loader()
        return spec


def after_import(name: str, then: Callable[[], None]) -> None:
    """Call ``then`` now if ``name`` is already imported, else right after the program first
    imports it."""
    if name in sys.modules:
        then()
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))
