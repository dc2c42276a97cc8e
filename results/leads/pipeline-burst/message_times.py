"""Each pipeline message's time from its send to its receive, read from a run's rank traces,
against the simulator's time for it with and without the shaper's burst. Only messages whose
receive was already waiting when the send began count: their receive's end is the arrival.
All ranks of these runs are on one machine, so their monotonic clocks agree. The model's
figures are for wan-sharing-dp1.yaml's link and messages (10 ms, 100 Mbit/s, hidden 1024, fp32).

    .venv/bin/python results/leads/pipeline-burst/message_times.py RUN_DIR > message_times.md
"""
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


def message_ms(cell: Path) -> list[float]:
    """Send start to receive end of every message whose receive was posted before its send."""
    by_rank = actions(cell)
    recvs = {(r, e["kind"], e["iter"], e["mb"], e["peer"]): e
             for r, evs in by_rank.items() for e in evs if e["kind"] in PAIRS.values()}
    out = []
    for r, evs in by_rank.items():
        for e in evs:
            if e["kind"] in PAIRS:
                recv = recvs.get((e["peer"], PAIRS[e["kind"]], e["iter"], e["mb"], r))
                if recv and recv["t0"] < e["t0"]:
                    out.append((recv["t1"] - e["t0"]) / 1e6)
    return sorted(out)


def main(run: Path) -> None:
    print(f"# Pipeline messages' send-to-receive times in {run.name} (written by message_times.py)\n")
    print("| cell | messages | min ms | median ms | max ms | model without burst ms | "
          "model with burst ms |")
    print("|---|---|---|---|---|---|---|")
    for cell in sorted((run / "cells").iterdir()):
        meta = json.loads((cell / "trace-rank0.jsonl").read_text().splitlines()[0])
        times = message_ms(cell)
        size = meta["seq_len"] * meta["microbatch_size"] * 1024 * 4  # hidden 1024, fp32
        bps, base = 100e6, 10e-3 + C.MESSAGE_LATENCY_S
        whole = base + size * C.WIRE_BYTES_PER_PAYLOAD_BYTE * 8 / bps
        burst = base + max(0.0, size - C.shaper_burst_bytes(bps)) * C.WIRE_BYTES_PER_PAYLOAD_BYTE * 8 / bps
        print(f"| {cell.name} ({meta['world_size']} ranks) | {len(times)} | {times[0]:.2f} | "
              f"{statistics.median(times):.2f} | {times[-1]:.2f} | {whole * 1e3:.2f} | "
              f"{burst * 1e3:.2f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
