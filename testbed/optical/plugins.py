"""Policies from files of one's own: ``path/to/file.py`` (its one class that derives from
``testbed.optical.policy.Policy``) or ``path/to/file.py:ClassName``. The class is built like
the built-in ones, ``cls(net, bounds)``; whatever it lacks of ``order``, ``slots`` and
``observe`` it inherits from ``Policy``. A relative path is taken from the experiment file's
directory. examples/optical_policy.py is one.
"""
from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

from testbed.errors import EXIT_BAD_INPUT, TestbedError
from testbed.optical.network import OpticalNetwork
from testbed.optical.policy import Policy, SlotBounds, built_in


class PolicyError(TestbedError):
    """A policy file's code failed while the sweep ran (exit 2: the input is wrong)."""

    exit_code = EXIT_BAD_INPUT


class Guarded:
    """A file policy whose failures say which policy and method failed, not a traceback."""

    def __init__(self, policy, label: str):
        self.policy, self.label, self.name = policy, label, policy.name

    def _call(self, method: str, *args):
        try:
            return getattr(self.policy, method)(*args)
        except Exception as e:  # the user's code
            raise PolicyError(f"policy {self.label}: {method}() raised "
                              f"{type(e).__name__}: {e}") from None

    def order(self, routes):
        got = self._call("order", routes)
        if not isinstance(got, list) or not got:
            raise PolicyError(f"policy {self.label}: order() must return a non-empty list of "
                              f"routes, got {got!r:.80}")
        return got

    def slots(self, transfer) -> int:
        got = self._call("slots", transfer)
        if isinstance(got, bool) or not isinstance(got, int):
            raise PolicyError(f"policy {self.label}: slots() must return an int, got {got!r:.80}")
        return got

    def observe(self, outcomes) -> None:
        self._call("observe", outcomes)


def is_file_policy(name: str) -> bool:
    return name.partition(":")[0].endswith(".py")


def policy_class(name: str, base_dir: Path) -> type:
    """The class a file policy names; raises ValueError saying what is wrong."""
    file, _, cls_name = name.partition(":")
    path = (base_dir / file) if not Path(file).is_absolute() else Path(file)
    if not path.is_file():
        raise ValueError(f"policy file {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"testbed_policy_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's code: say where it failed, not a traceback
        raise ValueError(f"policy file {path} fails to load: {type(e).__name__}: {e}") from None
    if cls_name:
        cls = getattr(module, cls_name, None)
        if not inspect.isclass(cls):
            raise ValueError(f"policy file {path} has no class {cls_name}")
        return cls
    found = [c for _, c in inspect.getmembers(module, inspect.isclass)
             if issubclass(c, Policy) and c is not Policy and c.__module__ == module.__name__]
    if len(found) != 1:
        names = ", ".join(c.__name__ for c in found) or "none"
        raise ValueError(f"policy file {path} must define exactly one subclass of "
                         f"testbed.optical.policy.Policy (found: {names}); or name one: "
                         f"{file}:ClassName")
    return found[0]


def make_policy(name: str, net: OpticalNetwork, bounds: SlotBounds, wait_threshold_s: float,
                base_dir: Path):
    """The policy ``name`` names: built in or from a file."""
    if not is_file_policy(name):
        return built_in(name, net, bounds, wait_threshold_s)
    cls = policy_class(name, base_dir)
    try:
        policy = cls(net, bounds)
    except Exception as e:
        raise ValueError(f"policy {name}: {cls.__name__}(net, bounds) failed: "
                         f"{type(e).__name__}: {e}") from None
    for method in ("order", "slots", "observe"):
        if not callable(getattr(policy, method, None)):
            raise ValueError(f"policy {name}: {cls.__name__} has no method {method}()")
    if "name" not in vars(cls):  # not its own name: the inherited one would mislabel it
        policy.name = name
    return Guarded(policy, name)
