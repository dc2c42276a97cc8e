"""Per iteration and rank, the compute and all-reduce steps of the hierarchical cell's traces
(traces/, a run of small10.yaml), in ms from the iteration's first action: which step of which
rank was late in the slow iterations. ``python steps.py > steps.txt``"""
import json
from pathlib import Path

HERE = Path(__file__).parent
traces = {r: [json.loads(line) for line in (HERE / "traces" / f"trace-rank{r}.jsonl").open()]
          for r in range(4)}
for it in range(1, 10):
    acts = [(r, a) for r in traces for a in traces[r]
            if a.get("type") == "action" and a["iter"] == it]
    t0 = min(a["t0"] for _, a in acts)
    print(f"iteration {it}: span {(max(a['t1'] for _, a in acts) - t0) / 1e6:.1f} ms")
    for r in traces:
        steps = [f"{a['kind'][:6]}{'' if a.get('peer') is None else a['peer']}:"
                 f"{(a['t0'] - t0) / 1e6:.1f}-{(a['t1'] - t0) / 1e6:.1f}"
                 for rr, a in acts if rr == r and a["kind"] in ("F", "B", "ALLREDUCE_STEP")]
        print(f"  rank {r}: {' '.join(steps)}")
