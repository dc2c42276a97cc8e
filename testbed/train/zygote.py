"""The pre-started rank interpreter: ``python -m testbed.train.zygote``.

Importing torch costs every rank seconds of CPU and about 220 MB of private memory; a sweep
would pay both for every rank of every cell. This process pays them once: it imports the worker
(and torch) and then forks one child per rank on request. A child enters the rank's network
namespace, takes its environment, working directory and log, and runs the worker's ``main``;
the pages torch filled at import stay shared with the zygote (copy-on-write).

Command line: ``python -m testbed.train.zygote [--entry MODULE]… [WARM…]``: the modules whose
``main(args)`` a child may run (default: the built-in worker), then modules only imported.

Protocol, one JSON object per line:

- stdin → ``{"id": N, "module": M, "args": [...], "env": {...}, "netns": PATH,
  "log": PATH, "cwd": PATH | null, "fresh": BOOL}``; ``M`` must be an entry module. With
  ``fresh`` the child is made to look like a new interpreter started with the zygote's own
  start-up environment plus ``env`` (``_as_new_interpreter``): how a user's program is run;
- stdout ← ``{"ready": true}`` once the imports are done; ``{"id": N, "pid": P}`` or
  ``{"id": N, "error": TEXT}`` per request; ``{"pid": P, "exit": CODE}`` when a child ends
  (CODE < 0: killed by signal −CODE, as subprocess reports it).

The zygote dies with its parent (PR_SET_PDEATHSIG), and so does every child with the zygote; end
of stdin ends the zygote after its children.
"""
from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import random
import select
import signal
import sys
from typing import Any

# the environment this interpreter was started with, before anything imported changed it
START_ENV = dict(os.environ)

WORKER_ENTRY = "testbed.train.worker"
# imported by the worker only where it is used; the runner's zygote warms it (its command line
# names the modules to warm: ``python -m testbed.train.zygote [MODULE…]``)
TORCH_EXECUTOR = "testbed.train.torch_executor"
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent exits."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def enter_netns(path: str) -> None:
    """Move this (single-threaded) process into the network namespace at ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _child(req: dict[str, Any], modules: dict[str, Any]) -> None:
    """In the forked child: become the rank and run it; never returns."""
    code = 1
    try:
        os.setsid()
        die_with_parent()
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        if req.get("netns"):  # none: the zygote's own (loopback runs)
            enter_netns(req["netns"])
        if req.get("cwd"):
            os.chdir(req["cwd"])
        module = modules[req["module"]]
        if req.get("fresh"):
            _as_new_interpreter(req["env"], module)
        else:
            os.environ.update(req["env"])
        sys.argv = [req["module"], *req["args"]]
        code = module.main(req["args"])
    except BaseException as e:  # noqa: BLE001 — the child must end here, whatever happened
        print(f"zygote child: {type(e).__name__}: {e}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 1)


def _as_new_interpreter(env: dict[str, str], module: Any) -> None:
    """What ``python -m MODULE`` started here with ``env`` added would differ in, undone:
    its environment is exactly START_ENV plus ``env``; SIGINT raises KeyboardInterrupt and
    SIGPIPE is ignored (Python's own start-up settings); ``sys.path[0]`` is the working
    directory; ``random`` (and numpy's global generator, if imported) is seeded anew, since a
    fork would otherwise repeat the zygote's sequence on every rank. The entry module's
    ``forked()`` is then called, if it has one, to take the new environment as its own.
    What cannot be undone (the hash seed, what was read from the environment at start-up) is
    why the caller forks only where that start-up environment is the zygote's."""
    os.environ.clear()
    os.environ.update(START_ENV)
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    if not sys.flags.safe_path and sys.path:
        sys.path[0] = os.getcwd()
    random.seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    if hasattr(module, "forked"):
        module.forked()


def _say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _spawn(line: bytes, modules: dict[str, Any]) -> int | None:
    """Fork the rank a request line asks for; returns its pid (None for a bad request)."""
    try:
        req = json.loads(line)
        if req.get("module") not in modules:
            raise ValueError(f"module {req.get('module')!r} is not preloaded as an entry")
    except ValueError as e:
        _say({"id": None, "error": str(e)})
        return None
    pid = os.fork()
    if pid == 0:
        _child(req, modules)
    _say({"id": req.get("id"), "pid": pid})
    return pid


def _reap(children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        _say({"pid": pid, "exit": os.waitstatus_to_exitcode(status)})


def serve(entries: list[str], warm: list[str]) -> int:
    """Import the entry modules and those to ``warm``, say ready, then fork a rank per
    request until stdin ends."""
    die_with_parent()
    modules = {m: importlib.import_module(m) for m in entries}
    for m in warm:
        importlib.import_module(m)
    gc.collect()
    gc.freeze()  # keep the imported objects' pages shared: the collector never touches them
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: set[int] = set()
    stdin, pending = sys.stdin.fileno(), b""
    _say({"ready": True})
    while True:
        readable, _, _ = select.select([stdin, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
        _reap(children)
        if stdin not in readable:
            continue
        chunk = os.read(stdin, 1 << 16)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        children.update(pid for pid in (_spawn(ln, modules) for ln in lines if ln.strip())
                        if pid is not None)
    for pid in list(children):
        os.waitpid(pid, 0)
    return 0


def command_line(argv: list[str]) -> tuple[list[str], list[str]]:
    """(entry modules, modules to warm) from ``[--entry MODULE]… [WARM…]``."""
    entries, warm = [], []
    it = iter(argv)
    for a in it:
        if a == "--entry":
            entries.append(next(it))
        else:
            warm.append(a)
    return entries or [WORKER_ENTRY], warm


if __name__ == "__main__":
    sys.exit(serve(*command_line(sys.argv[1:])))
