"""crosspipe_greedy against CrossPipe's own generator on the configuration both were run on,
its two selection rules, stable ties under sub-µs input noise, and the rule that won
surviving the cell file."""
from __future__ import annotations

import pytest

from testbed.schedule.context import Boundary, CrossDCContext
from testbed.schedule.generators import generate
from testbed.schedule.greedy import crosspipe_greedy, greedy_schedule
from testbed.schedule.ir import Schedule
from testbed.schedule.lower import lower
from testbed.sim import calibration
from testbed.sim.engine import simulate
from testbed.sim.iteration import Path, SimInput
from testbed.spec.costs import ComputeTimes

# The cross-check configuration (docs/crosspipe-comparison.md): p = 4 stages, m = 8
# microbatches, F = 20 ms, B = 40 ms split into I = W = 20 ms, at most 4 microbatches of
# activations per stage, one DC boundary between stages 1 and 2 with a one-way delay of
# 0/10/20/40 ms and a transfer (serialization) time per message of 0 or 8 ms.
PP, M, F_MS, B_MS, W_MS, LIMIT, BOUNDARY = 4, 8, 20.0, 40.0, 20.0, 4, 1
DELAYS_MS = (0, 10, 20, 40)
# Makespans (ms) CrossPipe's pp_generator gave on exact inputs, by transfer time
CROSSPIPE_GREEDY_MS = {0: (540, 580, 620, 700), 8: (592, 636, 676, 732)}
CROSSPIPE_1F1B_MS = {0: (660, 740, 820, 980)}
# testbed's greedy on the same inputs: CrossPipe's values without transfer; with the 8 ms
# transfer shorter at 0 and 10 ms delay (576, 616), equal at 20 and 40 ms
TESTBED_GREEDY_MS = {0: (540, 580, 620, 700), 8: (576, 616, 676, 732)}


def context(delay_ms: float, transfer_ms: float, noise_ms: float = 0.0) -> CrossDCContext:
    """The cross-check configuration; ``noise_ms`` is added to every boundary's delay and
    serialization, inside the DCs too (as ``testbed.plan`` sees unshaped links)."""
    bounds = {s: Boundary(noise_ms, noise_ms) for s in range(PP - 1)}
    bounds[BOUNDARY] = Boundary(delay_ms + noise_ms, transfer_ms + noise_ms)
    return CrossDCContext(F_MS, B_MS, W_MS, bounds, LIMIT)


def makespan_ms(s: Schedule, c: CrossDCContext) -> float:
    """testbed's simulator on the context's links: one FIFO per boundary and direction
    (exact inputs, as CrossPipe's simulator has them, with the ``no_overheads`` fixture)."""
    nbytes = 1000
    times = [ComputeTimes(c.f_ms / 1e3, c.b_ms / 1e3, c.w / 1e3)] * s.n_stages
    paths = {}
    for stage, b in c.boundaries.items():
        wire_bits = nbytes * 8 * calibration.WIRE_BYTES_PER_PAYLOAD_BYTE
        rate = wire_bits / (b.serialization_ms / 1e3) if b.serialization_ms else None
        for src, dst in ((stage, stage + 1), (stage + 1, stage)):
            paths[(src, dst)] = Path((f"{src}->{dst}",) if rate else (), rate, b.delay_ms / 1e3)
    return round(simulate(SimInput(lower(s), times, nbytes, 1, paths)).span_s * 1e3, 6)


@pytest.mark.parametrize("transfer_ms", [0, 8])
def test_greedy_matches_crosspipe_on_its_cross_check_configuration(no_overheads, transfer_ms):
    got = tuple(makespan_ms(crosspipe_greedy(PP, M, 1, context(d, transfer_ms)),
                            context(d, transfer_ms)) for d in DELAYS_MS)
    assert got == TESTBED_GREEDY_MS[transfer_ms]
    assert all(g <= cp for g, cp in zip(got, CROSSPIPE_GREEDY_MS[transfer_ms]))


def test_crosspipe_rule_alone_gives_crosspipes_makespans(no_overheads):
    for d, want in zip(DELAYS_MS, CROSSPIPE_GREEDY_MS[0]):
        s, own_us = greedy_schedule(PP, M, context(d, 0), "crosspipe")
        assert makespan_ms(s, context(d, 0)) == want == own_us / 1000


def test_simulators_agree_on_one_f_one_b(no_overheads):
    got = tuple(makespan_ms(generate("1f1b", PP, M), context(d, 0)) for d in DELAYS_MS)
    assert got == CROSSPIPE_1F1B_MS[0]


def test_the_shorter_rule_wins_and_is_named(no_overheads):
    # fixed I > F > W: 580/620/620/700 without transfer, 612/616/692/732 with 8 ms
    fixed = {(t, d): makespan_ms(greedy_schedule(PP, M, context(d, t), "fixed")[0],
                                 context(d, t)) for t in (0, 8) for d in DELAYS_MS}
    assert fixed[(0, 0)] == 580 and fixed[(8, 10)] == 616
    for (t, d), fixed_ms in fixed.items():
        s = crosspipe_greedy(PP, M, 1, context(d, t))
        assert makespan_ms(s, context(d, t)) <= fixed_ms
        assert s.variant in ("crosspipe", "fixed")
    assert crosspipe_greedy(PP, M, 1, context(0, 0)).variant == "crosspipe"  # 540 < 580


def test_an_evaluator_decides_between_the_rules():
    c = context(10, 8)
    picked = []

    def prefer_fixed(s: Schedule) -> float:
        picked.append(s.variant)
        return 1.0 if s.variant == "fixed" else 2.0

    s = crosspipe_greedy(PP, M, 1, CrossDCContext(c.f_ms, c.b_ms, c.w_ms, c.boundaries,
                                                  c.memory_limit, prefer_fixed))
    assert picked == ["crosspipe", "fixed"] and s.variant == "fixed"


@pytest.mark.parametrize("noise_ms", [1e-9, 5e-6, 1e-4])
@pytest.mark.parametrize("transfer_ms", [0, 8])
@pytest.mark.parametrize("delay_ms", DELAYS_MS)
def test_noise_on_every_boundary_leaves_the_schedule_unchanged(
        noise_ms, transfer_ms, delay_ms):
    """1e-9 ms (float noise), 5 ns (an unshaped small message) and 0.1 ms, within the rank's
    wait window (an 8 ms transfer computed as 7.9999999996 ms is the 1e-9 case)."""
    exact = crosspipe_greedy(PP, M, 1, context(delay_ms, transfer_ms))
    noisy = crosspipe_greedy(PP, M, 1, context(delay_ms, transfer_ms, noise_ms))
    assert noisy.to_rows() == exact.to_rows()
    assert noisy.variant == exact.variant


def test_the_rule_that_won_survives_the_cell_file():
    s = crosspipe_greedy(PP, M, 1, context(0, 0))
    back = Schedule.from_dict(s.to_dict())
    assert back.variant == s.variant == "crosspipe"
    assert lower(s).variant == "crosspipe"
    older = {k: v for k, v in s.to_dict().items() if k != "variant"}  # a cell file from before
    assert Schedule.from_dict(older).variant == ""
