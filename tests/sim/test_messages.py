"""Message numbers (testbed/sim/messages.py): one per message an iteration can send, every one
distinct, told back as the engine's (replica, direction, sending stage, microbatch)."""
from __future__ import annotations

import pytest

from testbed.schedule.generators import generate
from testbed.sim.messages import Messages


def test_every_message_has_its_own_number_and_reads_back():
    sizes = generate("1f1b", 4, 6)
    msgs = Messages(sizes, dp=3)
    seen = {}
    for d in range(3):
        for stage in range(4):
            for mb in range(6):
                for fwd in (True, False):
                    if (fwd and stage == 3) or (not fwd and stage == 0):
                        continue  # the last stage sends no activations, the first no gradients
                    k = msgs.base(d) + msgs.number(fwd, stage, mb)
                    seen[k] = (d, "F" if fwd else "B", stage, mb)
    assert sorted(seen) == list(range(len(msgs.arrival))) == list(range(3 * 2 * 3 * 6))
    assert all(msgs.described(k) == v for k, v in seen.items())


def test_a_single_stage_has_no_messages_and_holds_nothing():
    msgs = Messages(generate("1f1b", 1, 4096), dp=131_072)
    assert len(msgs.arrival) == len(msgs.known) == 0
    with pytest.raises(ValueError):
        msgs.number(True, 0, 0)
