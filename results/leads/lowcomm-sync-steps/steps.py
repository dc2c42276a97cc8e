"""The sync steps' ring steps per rank, in ms from the iteration's first action, from the
traces in this directory: ``python steps.py > steps.txt``."""
import json
from pathlib import Path

HERE = Path(__file__).parent
traces = {r: [json.loads(line) for line in (HERE / f"trace-rank{r}.jsonl").open()]
          for r in range(6)}
for it in (3, 7):
    acts = [(r, a) for r in traces for a in traces[r]
            if a.get("type") == "action" and a["iter"] == it]
    t0 = min(a["t0"] for _, a in acts)
    print(f"iteration {it}: span {(max(a['t1'] for _, a in acts) - t0) / 1e6:.1f} ms; "
          "ring steps per rank (stage, peer, start-end ms)")
    for r in traces:
        steps = [f"s{a['stage']}>{a['peer']} {(a['t0'] - t0) / 1e6:.1f}-{(a['t1'] - t0) / 1e6:.1f}"
                 for rr, a in acts if rr == r and a["kind"] == "ALLREDUCE_STEP"]
        print(f"  rank {r}: " + ", ".join(steps))
