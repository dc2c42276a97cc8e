"""The pre-started rank interpreter: ``python -m testbed.train.zygote``.

Importing torch costs every rank seconds of CPU and about 220 MB of private memory; a sweep
would pay both for every rank of every cell. This process pays them once: it imports the worker
(and torch) and then forks one child per rank on request. A child enters the rank's network
namespace, takes its environment, working directory and log, and runs the worker's ``main``;
the pages torch filled at import stay shared with the zygote (copy-on-write).

Protocol, one JSON object per line:

- stdin → ``{"id": N, "module": M, "args": [...], "env": {...}, "netns": PATH,
  "log": PATH, "cwd": PATH | null}``; ``M`` must be one of ``PRELOADED``;
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
import select
import signal
import sys
from typing import Any

PRELOADED = ("testbed.train.worker",)
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
        os.environ.update(req["env"])
        sys.argv = [req["module"], *req["args"]]
        code = modules[req["module"]].main(req["args"])
    except BaseException as e:  # noqa: BLE001 — the child must end here, whatever happened
        print(f"zygote child: {type(e).__name__}: {e}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 1)


def _say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _spawn(line: bytes, modules: dict[str, Any]) -> int | None:
    """Fork the rank a request line asks for; returns its pid (None for a bad request)."""
    try:
        req = json.loads(line)
        if req.get("module") not in modules:
            raise ValueError(f"module {req.get('module')!r} is not preloaded")
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


def serve(warm: list[str]) -> int:
    """Import the preloaded modules and those to ``warm``, say ready, then fork a rank per
    request until stdin ends."""
    die_with_parent()
    modules = {m: importlib.import_module(m) for m in PRELOADED}
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


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:]))
