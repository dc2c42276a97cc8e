"""The delay line's netlink messages and timing logic, without the kernel."""
from __future__ import annotations

import json
import random
import statistics
import struct
import time

import pytest

from testbed.net.shaping import delayline as dl, nfnetlink as nl


def _attrs(msg: bytes) -> dict[int, bytes]:
    out, off = {}, 20
    while off < len(msg):
        length, kind = struct.unpack_from("=HH", msg, off)
        out[kind] = msg[off + 4:off + length]
        off += (length + 3) & ~3
    return out


def test_config_binds_queue_with_metadata_copy_gso_and_long_queue():
    bind, params, tune = nl.config_messages(7, maxlen=5000)
    for m in (bind, params, tune):
        length, kind, flags = struct.unpack_from("=IHH", m)
        assert length == len(m) and kind == nl.NFQNL_MSG_CONFIG
        assert flags & nl.NLM_F_ACK  # errors (e.g. queue already bound) come back, not lost
        assert struct.unpack_from(">H", m, 18)[0] == 7  # res_id = queue number, big endian
    assert _attrs(bind)[nl.NFQA_CFG_CMD][0] == nl.NFQNL_CFG_CMD_BIND
    copy_range, mode = struct.unpack(">IB", _attrs(params)[nl.NFQA_CFG_PARAMS][:5])
    assert (copy_range, mode) == (0, nl.NFQNL_COPY_META)
    a = _attrs(tune)
    assert struct.unpack(">I", a[nl.NFQA_CFG_QUEUE_MAXLEN])[0] == 5000
    assert struct.unpack(">I", a[nl.NFQA_CFG_FLAGS])[0] == nl.NFQA_CFG_F_GSO
    assert struct.unpack(">I", a[nl.NFQA_CFG_MASK])[0] == nl.NFQA_CFG_F_GSO


def test_batch_verdict_accepts_up_to_an_id():
    m = nl.verdict_message(3, nl.NF_ACCEPT, 1234, batch=True)
    assert struct.unpack_from("=H", m, 4)[0] == nl.NFQNL_MSG_VERDICT_BATCH
    verdict, pid = struct.unpack(">II", _attrs(m)[nl.NFQA_VERDICT_HDR])
    assert (verdict, pid) == (nl.NF_ACCEPT, 1234)
    single = nl.verdict_message(3, nl.NF_DROP, 9, batch=False)
    assert struct.unpack_from("=H", single, 4)[0] == nl.NFQNL_MSG_VERDICT


def _packet_msg(pid: int, extra_first: bool) -> bytes:
    hdr = nl._attr(nl.NFQA_PACKET_HDR, struct.pack(">IHB", pid, 0x0800, 2) + b"\0")
    other = nl._attr(9, b"\0" * 8)
    attrs = other + hdr if extra_first else hdr
    return nl._message(nl.NFQNL_MSG_PACKET, 0, attrs)


def test_packet_ids_are_read_from_a_batch_of_messages():
    buf = b"".join(_packet_msg(i, extra_first=i % 2 == 0) for i in range(1, 6))
    ids: list[int] = []
    errors = nl.packet_ids(memoryview(buf), len(buf), ids)
    assert ids == [1, 2, 3, 4, 5] and errors == 0


class QueueSocket:
    """Stands in for the NFQUEUE netlink socket only (these are unit tests of the delay line's
    own scheduling; tests/net/test_shaping.py runs it on the kernel): recv_into hands out the
    queued packet messages a batch at a time, send records the verdicts."""

    def __init__(self, batches: list[bytes]):
        self.batches, self.sent = list(batches), []

    def recv_into(self, view) -> int:
        if not self.batches:
            raise BlockingIOError
        data = self.batches.pop(0)
        view[:len(data)] = data
        return len(data)

    def send(self, msg: bytes) -> None:
        self.sent.append(msg)


def _line(tmp_path, cfg: dict) -> dl.DelayLine:
    conf = tmp_path / "c.json"
    conf.write_text(json.dumps(cfg))
    line = dl.DelayLine(0, str(conf), str(tmp_path / "s.json"), seed=5)
    line.reload()
    return line


def test_jitter_never_reorders_the_delay_lines_releases(tmp_path):
    """Packets read 0.1 ms apart with 10 ms ± 5 ms jitter: a plain arrival + sample would
    reorder most of them; DelayLine._read holds each behind the one before."""
    line = _line(tmp_path, {"delay_ms": 10, "jitter_ms": 5})
    t0 = time.monotonic() + 60  # arrivals (no kernel stamps here) are the wait starts below
    for i in range(1, 501):
        line.sock = QueueSocket([_packet_msg(i, extra_first=False)])
        line._read(memoryview(bytearray(dl.RECV_BUF)), waited_since=t0 + i * 1e-4)
    due = [t for t, _ in line.held]
    assert [pid for _, pid in line.held] == list(range(1, 501))
    assert due == sorted(due)
    gaps = [b - a for a, b in zip(due, due[1:])]
    assert max(gaps) > 1e-3  # the jitter is really there: some packets wait for a slow one


def test_jitter_distributions_have_the_configured_spread():
    want_std = {"normal": 1.0, "uniform": 1 / 3 ** 0.5, "pareto": 1.0,
                "paretonormal": (0.25 ** 2 + 0.75 ** 2) ** 0.5}
    for dist, unit_std in want_std.items():
        s = dl.Sampler({"delay_ms": 50, "jitter_ms": 2, "jitter_distribution": dist},
                       random.Random(2))
        xs = [s.draw() * 1000 for _ in range(50000)]
        mean = statistics.fmean(xs)
        assert abs(mean - 50) < 0.2, dist
        # Pareto's tail (alpha 3) makes its sample spread converge slowly: 20 % there
        assert statistics.pstdev(xs) == pytest.approx(2 * unit_std, rel=0.2), dist
        assert all(x >= 0 for x in xs)
    uniform = dl.Sampler({"delay_ms": 50, "jitter_ms": 2, "jitter_distribution": "uniform"},
                         random.Random(3))
    xs = [uniform.draw() * 1000 for _ in range(5000)]
    assert 48 <= min(xs) < 48.1 and 51.9 < max(xs) <= 52
    pareto = dl.Sampler({"delay_ms": 50, "jitter_ms": 2, "jitter_distribution": "pareto"},
                        random.Random(4))
    xs = [pareto.draw() * 1000 for _ in range(20000)]
    assert statistics.median(xs) < statistics.fmean(xs)  # its long tail is on the slow side


def test_no_jitter_means_every_packet_gets_exactly_the_delay():
    s = dl.Sampler({"delay_ms": 7, "jitter_ms": 0}, random.Random(1))
    assert {s.draw() for _ in range(100)} == {0.007}


def test_gilbert_elliott_loss_matches_its_stationary_rate():
    ge = dl.GilbertElliott({"p_pct": 1, "r_pct": 10, "loss_bad_pct": 100, "loss_good_pct": 0},
                           random.Random(3))
    n = 200_000
    lost = sum(ge.drop() for _ in range(n)) / n
    expected = 0.01 / (0.01 + 0.10)  # time in the bad state, where every packet is lost
    assert abs(lost - expected) < 0.01
