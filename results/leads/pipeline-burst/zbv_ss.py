"""The TCP state of rank 1's connection to rank 2 (10.1.0.11 → 10.2.0.10: the activations of
ZB-V's stage 1 and the gradients of its stage 6 cross the DCs on it) over the cell, from
zbv_ss.sh's log: congestion window (segments of 1448 bytes), slow-start threshold, smoothed
RTT, bytes waiting in the send queue and the retransmissions so far. One sample in twelve.

    .venv/bin/python results/leads/pipeline-burst/zbv_ss.py LOG > results/leads/pipeline-burst/zbv_ss.txt
"""
import re
import sys


def field(info: str, key: str) -> str:
    m = re.search(rf"\b{key}:(\S+)", info)
    return m.group(1) if m else ""


def main(path: str) -> None:
    lines = open(path, encoding="utf-8").read().split("\n")
    t, rows = None, []
    for i, line in enumerate(lines):
        if line.startswith("T "):
            t = float(line[2:])
        elif "10.1.0.11" in line and "10.2.0.10" in line and i + 1 < len(lines):
            info = lines[i + 1]
            rows.append((t, line.split()[1], field(info, "cwnd"), field(info, "ssthresh"),
                         field(info, "rtt").split("/")[0], field(info, "retrans")))
    print("# rank 1 → rank 2 connection during the ZB-V cell (written by zbv_ss.py)\n")
    print("| s since first sample | send queue bytes | cwnd | ssthresh | rtt ms | retrans (now/total) |")
    print("|---|---|---|---|---|---|")
    for r in rows[::12]:
        print(f"| {r[0] - rows[0][0]:.2f} | {r[1]} | {r[2]} | {r[3] or '-'} | {r[4]} | {r[5] or '-'} |")


if __name__ == "__main__":
    main(sys.argv[1])
