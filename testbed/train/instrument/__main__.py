"""``python -m testbed.train.instrument --cell CELL --out DIR -- SCRIPT [ARGS…]`` (or ``-- -m
MODULE [ARGS…]``): run a program as ``python SCRIPT`` would, traced from outside (see the
package's docstring). Exit status: the program's; 2 when the cell file cannot be read."""
from __future__ import annotations

import argparse
import atexit
import gc
import os
import runpy
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from testbed.cell.cellfile import CellFile, CellFileError
import testbed.train.instrument as instrument
from testbed.train.instrument import Instrument, install


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m testbed.train.instrument",
                                 description="run a program with torch.distributed.pipelining "
                                             "traced from outside")
    ap.add_argument("--cell", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("program", nargs=argparse.REMAINDER,
                    help="-- SCRIPT [ARGS…] or -- -m MODULE [ARGS…]")
    args = ap.parse_args(argv)
    args.program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not args.program or args.program == ["-m"]:
        ap.error("give the program after --: SCRIPT [ARGS…] or -m MODULE [ARGS…]")
    return args


def _run(program: list[str]) -> None:
    """Run ``program`` as ``python PROGRAM…`` would: sys.argv, sys.path[0], __main__, and the
    environment it was started with."""
    start_env = instrument.ENV_AT_START
    for key in set(os.environ) - set(start_env):
        del os.environ[key]
    os.environ.update(start_env)
    if program[0] == "-m":
        sys.argv = program[1:]
        runpy.run_module(program[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(program)
        sys.path.insert(0, str(Path(program[0]).resolve().parent))
        runpy.run_path(program[0], run_name="__main__")


def forked() -> None:
    """In a rank forked from the pre-started interpreter (``testbed.train.zygote``), which
    imported torch before this rank's environment was set: that environment is the one the
    program starts with."""
    instrument.ENV_AT_START = dict(os.environ)


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        cell = CellFile.read(args.cell)
    except CellFileError as e:
        print(f"instrument: {e}", file=sys.stderr)
        return 2
    w = cell.workload
    ins = Instrument(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                     args.out, w.warmup, "program")
    install(ins)
    return _finish(ins, args.program)


def _finish(ins: Instrument, program: list[str]) -> int:
    """Run the program; the trace ends ok on exit status 0, else with the error. Either way
    the process then ends here (``_leave``), not in the interpreter's shutdown: torch's
    shutdown with a process group left open can hang forever (objects the program left for
    the final garbage collection join gloo threads that wait for the GIL), and the runner
    names the rank that failed first by who exits."""
    try:
        _run(program)
        status: Any = 0
    except SystemExit as e:
        status = e.code
    except BaseException as e:  # noqa: BLE001 — the program's own failure, reported as python would
        traceback.print_exc()
        status = e
    code = status if isinstance(status, int) else (0 if status is None else 1)
    if isinstance(status, str):
        print(status, file=sys.stderr)
    if code == 0:
        ins.end("ok", None)
        _leave(0, clean=True)
    why = f"{type(status).__name__}: {status}" if isinstance(status, BaseException) \
        else f"exit status {code}"
    ins.end("error", why)
    _leave(code, clean=False)


def _leave(code: int, clean: bool) -> None:
    """End the process with ``code``. After a clean finish first do what the interpreter's
    shutdown would do for the program while the interpreter is still whole: wait for its
    non-daemon threads, free what it left behind (closing its files), run its atexit
    functions; then flush and ``os._exit``."""
    if clean:
        main = threading.main_thread()
        for t in threading.enumerate():
            if t is not main and not t.daemon:
                t.join()
        gc.collect()
        atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
