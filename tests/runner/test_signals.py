"""The runner turns SIGTERM into a clean stop; a process forked inside the run (pyroute2 forks a
child to enter a namespace, and ends it with SIGTERM) must not take that path: it would unwind
its copy of the runner's stack and tear down the network being built."""
from __future__ import annotations

import os
import signal
import time

import pytest

from testbed.runner.run import Interrupted, _signals_as_interrupt


def test_sigterm_interrupts_the_run_itself():
    with pytest.raises(Interrupted):
        with _signals_as_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends


def test_a_forked_child_dies_on_sigterm_without_unwinding_the_runners_code(tmp_path):
    unwound = tmp_path / "unwound"
    with _signals_as_interrupt():
        pid = os.fork()
        if pid == 0:  # the child: what a pyroute2 helper is while it waits to be ended
            try:
                try:
                    time.sleep(30)
                finally:  # stands for the runner's teardown in a `finally` up the stack
                    unwound.write_text("the child ran the runner's clean-up")
            finally:
                os._exit(0)
        time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGTERM
    assert not unwound.exists()
