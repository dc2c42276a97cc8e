"""The project's error hierarchy.

Library code raises these; only ``testbed.__main__`` turns them into exit codes and short
messages. Each carries data, not only a string.
"""
from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Iterator

EXIT_OK = 0
EXIT_CELLS_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_MACHINE = 3
EXIT_INTERNAL = 4  # a bug: an exception no part of testbed raised on purpose


class TestbedError(Exception):
    """Base of every error the project raises on purpose."""

    exit_code = EXIT_CELLS_FAILED


@dataclass(frozen=True)
class Problem:
    """One problem in an input file: where it is and what is wrong.

    ``line`` and ``column`` are 1-based; 0 means unknown.
    """

    file: str
    line: int
    column: int
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}" if self.line else self.file
        return f"{where} {self.path}: {self.message}" if self.path else f"{where} {self.message}"


@dataclass
class SpecError(TestbedError):
    """The experiment or topology file is invalid; holds every problem found (exit 2)."""

    problems: list[Problem] = field(default_factory=list)
    exit_code = EXIT_BAD_INPUT

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.problems)


class MachineError(TestbedError):
    """The machine lacks something required; the message says what and how to get it (exit 3)."""

    exit_code = EXIT_MACHINE

    def __init__(self, missing: str, how: str = ""):
        self.missing, self.how = missing, how
        super().__init__(f"{missing}" + (f"; {how}" if how else ""))


class NetworkError(TestbedError):
    """Building, shaping or tearing down the emulated network failed."""


class ShapingError(NetworkError):
    """A link's shaping could not be applied or reads back different from the request."""


@dataclass
class CommandError(TestbedError):
    """A command failed; carries the argv, exit code and the last lines of its output."""

    argv: list[str]
    returncode: int
    output: str = ""
    where: str = ""

    def __str__(self) -> str:
        tail = "\n".join(self.output.strip().splitlines()[-5:])
        loc = f" in {self.where}" if self.where else ""
        return f"command {self.argv!r}{loc} exited {self.returncode}" + (f": {tail}" if tail else "")


class RefusedError(TestbedError):
    """The experiment would run, but not as it claims to: something of it would escape the
    emulation (NCCL over RDMA, which tc cannot shape). Refused before any rank starts, the
    network torn down, unless the user opts in; the message says why and how (exit 2)."""

    exit_code = EXIT_BAD_INPUT


class WorkerError(TestbedError):
    """A training worker crashed, hung or could not reach its peers."""


@dataclass
class StorageError(TestbedError):
    """A file or directory could not be written: a full disk, a read-only file system, a
    directory the user cannot write. The user's to fix, not a bug: the message names the path
    and the system's reason (``errno``'s words). Exit 1; 3 (the machine lacks room or a
    writable place) when it happens before anything ran (``before_run``)."""

    path: str
    errno: int | None
    reason: str
    action: str = "write"
    hint: str = ""
    exit_code: int = EXIT_CELLS_FAILED

    def __str__(self) -> str:
        return f"cannot {self.action} {self.path}: {self.reason}" + (
            f"; {self.hint}" if self.hint else "")

    @classmethod
    def of(cls, e: OSError, path: str | PurePath, action: str = "write") -> "StorageError":
        return cls(str(path), e.errno, e.strerror or str(e), action)

    def before_run(self) -> "StorageError":
        """The same error, as one that stopped a run before anything ran (exit 3)."""
        return dataclasses.replace(self, exit_code=EXIT_MACHINE)

    def with_hint(self, hint: str) -> "StorageError":
        return dataclasses.replace(self, hint=hint)


@contextmanager
def writing(path: str | PurePath, action: str = "write") -> Iterator[None]:
    """Turn an OSError raised inside the block into a StorageError naming ``path``."""
    try:
        yield
    except OSError as e:
        raise StorageError.of(e, path, action) from e
