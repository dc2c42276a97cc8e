"""ICMP echo RTTs with microsecond resolution (ping prints only 3 significant digits).

Run inside the source namespace: ``python -m testbed.net.icmp DEST COUNT INTERVAL_S``; prints a
JSON object ``{"sent": n, "rtt_ms": [...], "socket": "dgram"|"raw"}``. The far side answers in
its kernel (no userspace wake-up there); this side takes the reply's kernel receive timestamp
(SO_TIMESTAMPNS), so neither end adds a process's scheduling delay to the measurement.

No privileges needed: it uses an ICMP *datagram* socket (the kernel fills in the echo id and
hands back only our replies), which any user whose group is in ``net.ipv4.ping_group_range``
may open (Debian's default covers every group; the sshaccess role sets it on lab hosts). Where
that range excludes the caller (e.g. fresh network namespaces: ``1 0``) it falls back to a raw
socket, which needs root or CAP_NET_RAW; with neither it exits 1 saying which sysctl to set.
"""
from __future__ import annotations

import json
import os
import select
import socket
import struct
import sys
import time

SO_TIMESTAMPNS = 35
ICMP_ECHO, ICMP_ECHOREPLY = 8, 0
WAIT_AFTER_LAST_S = 5.0


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


def echo_request(ident: int, seq: int, payload: bytes = b"testbed-rtt-probe") -> bytes:
    header = struct.pack("!BBHHH", ICMP_ECHO, 0, 0, ident, seq)
    return struct.pack("!BBHHH", ICMP_ECHO, 0, checksum(header + payload), ident, seq) + payload


def open_socket() -> tuple[socket.socket, str]:
    """An ICMP datagram socket if ping_group_range allows us one, else a raw one (root).
    Raises PermissionError naming the sysctl when neither may be opened."""
    try:
        return socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP), "dgram"
    except PermissionError:
        pass
    try:
        return socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP), "raw"
    except PermissionError:
        raise PermissionError("ICMP echo needs an ICMP datagram socket (add this user's group "
                              "to net.ipv4.ping_group_range) or a raw one (root)") from None


def _reply(sock: socket.socket, ident: int | None) -> tuple[int, int] | None:
    """(seq, kernel receive time in ns) of one echo reply for us, or None for other packets.
    A raw socket sees whole IP packets and everyone's replies (``ident`` tells ours); a
    datagram socket sees only the ICMP message of replies to itself (``ident`` None)."""
    data, anc, _, _ = sock.recvmsg(2048, socket.CMSG_SPACE(16))
    ihl = (data[0] & 0x0F) * 4 if ident is not None else 0
    kind, _, _, rid, seq = struct.unpack_from("!BBHHH", data, ihl)
    if kind != ICMP_ECHOREPLY or (ident is not None and rid != ident):
        return None
    for level, ctype, cdata in anc:
        if level == socket.SOL_SOCKET and ctype == SO_TIMESTAMPNS:
            sec, nsec = struct.unpack("=qq", cdata[:16])
            return seq, sec * 1_000_000_000 + nsec
    return seq, time.time_ns()


def probe(dest: str, count: int, interval_s: float) -> dict:
    """Send ``count`` echo requests ``interval_s`` apart; collect replies until all are in or
    5 s after the last send. RTTs in ms, in order of sequence number."""
    sock, kind = open_socket()
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    ident = os.getpid() & 0xFFFF  # a datagram socket replaces it with its own
    match = ident if kind == "raw" else None
    sent: dict[int, int] = {}
    rtts: dict[int, float] = {}
    next_send, seq = time.monotonic(), 0
    deadline = None
    while len(rtts) < count:
        now = time.monotonic()
        if seq < count and now >= next_send:
            sent[seq] = time.time_ns()
            sock.sendto(echo_request(ident, seq), (dest, 0))
            seq += 1
            next_send += interval_s
            if seq == count:
                deadline = now + WAIT_AFTER_LAST_S
            continue
        if deadline is not None and now > deadline:
            break
        wait = (next_send if seq < count else deadline) - now
        if select.select([sock], [], [], max(0.0, wait))[0]:
            got = _reply(sock, match)
            if got and got[0] in sent and got[0] not in rtts:
                rtts[got[0]] = (got[1] - sent[got[0]]) / 1e6
    sock.close()
    return {"sent": count, "rtt_ms": [round(rtts[k], 4) for k in sorted(rtts)], "socket": kind}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m testbed.net.icmp DEST COUNT INTERVAL_S", file=sys.stderr)
        return 2
    try:
        print(json.dumps(probe(argv[0], int(argv[1]), float(argv[2]))))
    except PermissionError as e:
        print(f"testbed.net.icmp: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
