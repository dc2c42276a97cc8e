"""``python -m testbed``: maps errors to exit codes and short messages.

Set TESTBED_DEBUG=1 to see full tracebacks.

The design card's command is ``sudo python -m testbed run exp.yaml`` from the repository root,
where ``python`` is the system's, which has none of testbed's dependencies: the project's own
``.venv`` (made by ``bash setup.sh``) has them. So before anything third-party is imported, a
command line run by an interpreter other than that venv's is handed to it (``os.execv``); where
there is no venv and the dependencies are missing, one line says what to type instead. Only this
module and ``testbed/__init__.py`` run under the system interpreter, so both import nothing
outside the standard library (and ``testbed.errors``, which imports nothing either).
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from testbed.errors import EXIT_INTERNAL, EXIT_MACHINE, TestbedError

# Set in the environment of the re-executed interpreter, so that it never re-executes again
# (say, a venv whose python resolves somewhere unexpected); popped there at once, so that
# commands it starts in turn are not affected.
REEXEC_GUARD = "TESTBED_REEXEC"
# What the CLI cannot start without (torch is imported only where a worker runs).
REQUIRED = ("pydantic", "yaml", "rich")


def project_venv() -> Path:
    """The repository's ``.venv``, next to the ``testbed`` package this module belongs to."""
    return Path(__file__).resolve().parent.parent / ".venv"


def _use_project_venv(argv: list[str]) -> None:
    """Re-execute ``python -m testbed argv…`` with the project's venv when it exists and this
    interpreter is not it. Compares prefixes, not executables: a venv's python is a symlink to
    the system's."""
    seen = os.environ.pop(REEXEC_GUARD, None)
    venv = project_venv()
    python = venv / "bin" / "python"
    if seen or not python.exists():
        return
    if Path(sys.prefix).resolve() == venv.resolve():
        return
    os.environ[REEXEC_GUARD] = "1"
    os.execv(str(python), [str(python), "-m", "testbed", *argv])


def _missing_dependency() -> str | None:
    """The first module the CLI needs that this interpreter cannot import, or None."""
    for name in REQUIRED:
        try:
            __import__(name)
        except ImportError:
            return name
    return None


def _bootstrap(argv: list[str]) -> None:
    """For a command line (not a call from Python): run in the project's venv, or say in one
    line how to get one (exit 3) instead of a ModuleNotFoundError traceback."""
    _use_project_venv(argv)
    missing = _missing_dependency()
    if missing is None:
        return
    venv = project_venv()
    if Path(sys.prefix).resolve() == venv.resolve():
        hint = "the project's .venv is incomplete: run `bash setup.sh` as root again to repair it"
    elif (venv / "bin" / "python").exists():
        hint = f"run `{venv / 'bin' / 'python'} -m testbed …` instead"
    else:
        hint = ("testbed's dependencies live in the project's .venv: run `bash setup.sh` as "
                "root in the repository first, then `sudo python -m testbed …`")
    print(f"testbed: {sys.executable} has no module '{missing}'; {hint}", file=sys.stderr)
    sys.exit(EXIT_MACHINE)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (0 ok, 1 cells failed, 2 bad input, 3 machine,
    4 internal error: a bug, reported with its type; TESTBED_DEBUG=1 shows the traceback).
    Without ``argv`` (a command line: ``python -m testbed``, the ``testbed`` script) it first
    moves to the project's venv if it is not running there."""
    if argv is None:
        _bootstrap(sys.argv[1:])
    debug = os.environ.get("TESTBED_DEBUG") == "1"
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    # The console shows warnings (or everything when debugging) even when a run raises the
    # root level to INFO for its run.log.
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.DEBUG if debug else logging.WARNING)
    from testbed import cli

    try:
        return cli.main(argv)
    except TestbedError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the one place that turns surprises into messages
        if debug:
            raise
        print(f"internal error: {type(e).__name__}: {e} (set TESTBED_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
