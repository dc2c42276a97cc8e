"""Each pipeline message's time from its send to its receive, read from a run's rank traces,
against the simulator's time for it with and without the shaper's burst. Only messages between
the two DCs whose receive was already waiting when the send began count: their receive's end
is the arrival. All ranks of these runs are on one machine, so their monotonic clocks agree.
The link's one-way delay and rate are the cell's swept ``links.inter_dc`` values, else
``--delay-ms`` and ``--rate-mbit`` (default: wan-sharing-dp1.yaml's 10 ms and 100 Mbit/s).

    .venv/bin/python results/leads/pipeline-burst/message_times.py RUN_DIR > message_times.md
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from testbed.sim import calibration as C  # noqa: E402

PAIRS = {"SEND_F": "RECV_F", "SEND_B": "RECV_B"}


def actions(cell: Path) -> dict[int, list[dict]]:
    out = {}
    for path in sorted(cell.glob("trace-rank*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line]
        out[lines[0]["rank"]] = [e for e in lines[1:] if e.get("type") == "action"]
    return out


def messages(cell: Path) -> list[tuple[int, float]]:
    """(bytes, send start to receive end in ms) of every message between the DCs whose receive
    was posted before its send."""
    by_rank = actions(cell)
    dc = {p["rank"]: p["dc"] for p in json.loads((cell / "cell.json").read_text())["placement"]}
    recvs = {(r, e["kind"], e["iter"], e["stage"], e["mb"], e["peer"]): e
             for r, evs in by_rank.items() for e in evs if e["kind"] in PAIRS.values()}
    out = []
    for r, evs in by_rank.items():
        for e in evs:
            if e["kind"] in PAIRS and dc[r] != dc[e["peer"]]:
                stage = e["stage"] + (1 if e["kind"] == "SEND_F" else -1)
                recv = recvs.get((e["peer"], PAIRS[e["kind"]], e["iter"], stage, e["mb"], r))
                if recv and recv["t0"] < e["t0"]:
                    out.append((e["bytes"], (recv["t1"] - e["t0"]) / 1e6))
    return sorted(out, key=lambda m: m[1])


def model_ms(size: int, delay_ms: float, rate_mbit: float, burst: bool) -> float:
    bps = rate_mbit * 1e6
    sent = max(0.0, size - C.shaper_burst_bytes(bps)) if burst else size
    return delay_ms + (C.MESSAGE_LATENCY_S + sent * C.WIRE_BYTES_PER_PAYLOAD_BYTE * 8 / bps) * 1e3


def main(run: Path, delay_ms: float, rate_mbit: float) -> None:
    print(f"# Pipeline messages' send-to-receive times in {run.name} (written by message_times.py)\n")
    print("| cell | bytes | messages | min ms | median ms | max ms | model without burst ms | "
          "model with burst ms |")
    print("|---|---|---|---|---|---|---|---|")
    for cell in sorted((run / "cells").iterdir()):
        params = json.loads((cell / "cell.json").read_text())["params"]
        delay = params.get("links.inter_dc.delay_ms", delay_ms)
        rate = params.get("links.inter_dc.rate_mbit", rate_mbit)
        found = messages(cell)
        for size in sorted({b for b, _ in found}):
            times = [t for b, t in found if b == size]
            print(f"| {cell.name} ({', '.join(f'{v}' for v in params.values())}) | {size} | "
                  f"{len(times)} | {times[0]:.2f} | {statistics.median(times):.2f} | "
                  f"{times[-1]:.2f} | {model_ms(size, delay, rate, False):.2f} | "
                  f"{model_ms(size, delay, rate, True):.2f} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("--delay-ms", type=float, default=10.0)
    ap.add_argument("--rate-mbit", type=float, default=100.0)
    a = ap.parse_args()
    main(a.run, a.delay_ms, a.rate_mbit)
