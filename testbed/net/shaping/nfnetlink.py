"""NFQUEUE over raw nfnetlink, as the delay line (``testbed.net.shaping.delayline``) speaks
it: the messages that bind a queue (metadata copy only, GSO packets whole, a long queue),
verdicts for one packet or a batch up to an id, and reading packet ids and kernel receive
times out of what the kernel sends. No libnetfilter_queue: its Python bindings offer neither
``NFQA_CFG_F_GSO`` nor batch verdicts (see docs/facts.md).

This module imports only the standard library so that a delay-line process starts in ~50 ms.
"""
from __future__ import annotations

import os
import socket
import struct

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
SO_RCVBUFFORCE = 33
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = NFNL_SUBSYS_QUEUE << 8 | 0
NFQNL_MSG_VERDICT = NFNL_SUBSYS_QUEUE << 8 | 1
NFQNL_MSG_CONFIG = NFNL_SUBSYS_QUEUE << 8 | 2
NFQNL_MSG_VERDICT_BATCH = NFNL_SUBSYS_QUEUE << 8 | 3
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_GSO = 4
NFQA_PACKET_HDR, NFQA_VERDICT_HDR, NFQA_TIMESTAMP = 1, 2, 4
SO_TIMESTAMPNS = 35
NF_DROP, NF_ACCEPT = 0, 1

SOCK_RCVBUF = 64 << 20      # kernel-side buffer; overruns show up as queue drops, never silently
QUEUE_MAXLEN = 1 << 16      # packets the kernel may hold for us per queue


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * ((4 - length % 4) % 4)


def _message(kind: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST, seq: int = 0) -> bytes:
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return struct.pack("=IHHII", 16 + len(body), kind, flags, seq, 0) + body


def config_messages(queue: int, maxlen: int = QUEUE_MAXLEN) -> list[bytes]:
    """The netlink requests that bind ``queue`` with metadata copy, GSO and a long queue."""
    bind = _attr(NFQA_CFG_CMD, struct.pack("=BxH", NFQNL_CFG_CMD_BIND, 0))
    params = _attr(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META))
    tune = (_attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", maxlen))
            + _attr(NFQA_CFG_MASK, struct.pack(">I", NFQA_CFG_F_GSO))
            + _attr(NFQA_CFG_FLAGS, struct.pack(">I", NFQA_CFG_F_GSO)))
    flags = NLM_F_REQUEST | NLM_F_ACK
    return [_message(NFQNL_MSG_CONFIG, queue, bind, flags, 1),
            _message(NFQNL_MSG_CONFIG, queue, params, flags, 2),
            _message(NFQNL_MSG_CONFIG, queue, tune, flags, 3)]


def verdict_message(queue: int, verdict: int, packet_id: int, batch: bool) -> bytes:
    """A verdict for one packet, or (batch) for every queued packet with id ≤ ``packet_id``."""
    hdr = _attr(NFQA_VERDICT_HDR, struct.pack(">II", verdict, packet_id))
    return _message(NFQNL_MSG_VERDICT_BATCH if batch else NFQNL_MSG_VERDICT, queue, hdr)


def open_queue(queue: int) -> socket.socket:
    """Bind NFQUEUE ``queue`` in the current network namespace; raises OSError with the reason."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, SOCK_RCVBUF)
    sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
    sock.bind((0, 0))
    for msg in config_messages(queue):
        sock.send(msg)
        reply = sock.recv(65536)
        length, kind = struct.unpack_from("=IH", reply)
        if kind == NLMSG_ERROR:
            (err,) = struct.unpack_from("=i", reply, 16)
            if err:
                raise OSError(-err, f"NFQUEUE {queue} config: {os.strerror(-err)}")
    sock.setblocking(False)
    return sock


def packet_ids(buf: memoryview, n: int, out: list[int], stamps: list[float] | None = None) -> int:
    """Append the packet ids of the NFQUEUE packet messages in ``buf[:n]`` to ``out`` and, if
    ``stamps`` is given, each packet's kernel receive time (wall clock, s; 0.0 when the kernel
    sent none). Returns the number of error messages seen."""
    off, errors = 0, 0
    unpack = struct.unpack_from
    while off + 16 <= n:
        length, kind = unpack("=IH", buf, off)
        if length < 16:
            break
        if kind == NFQNL_MSG_PACKET:
            a, end, pid, ts = off + 20, off + length, None, 0.0
            while a + 4 <= end:
                alen, atype = unpack("=HH", buf, a)
                atype &= 0x7FFF
                if atype == NFQA_PACKET_HDR:
                    pid = unpack(">I", buf, a + 4)[0]
                    if stamps is None:
                        break
                elif atype == NFQA_TIMESTAMP:
                    sec, usec = unpack(">QQ", buf, a + 4)
                    ts = sec + usec * 1e-6
                    break
                a += (alen + 3) & ~3
            if pid is not None:
                out.append(pid)
                if stamps is not None:
                    stamps.append(ts)
        elif kind == NLMSG_ERROR and unpack("=i", buf, off + 16)[0]:
            errors += 1
        off += (length + 3) & ~3
    return errors


def enable_rx_timestamps() -> socket.socket:
    """Keep the kernel stamping received packets (a global static key, switched on while any
    socket asks for timestamps), so that NFQUEUE messages carry the packet's arrival time."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    return s
