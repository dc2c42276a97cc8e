"""gradient_sync's low-communication modes as the file gives them: which iterations sync which
fragment, the bytes each sync puts on the wire per outer dtype, and the refusals (exit 2)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from testbed.spec.gradsync import AFTER_LAST_ACTION, AT_START, GradientSync

ROOT = Path(__file__).resolve().parents[2]


def _syncs(sync: GradientSync, n: int) -> dict[int, list]:
    return {it: sync.syncs_in(it) for it in range(n) if sync.syncs_in(it)}


def test_every_step_has_no_outer_sync():
    assert _syncs(GradientSync(), 20) == {}


def test_diloco_syncs_everything_after_every_h_th_inner_step():
    sync = GradientSync(mode="diloco", inner_steps=4)
    # iteration it ends inner step it + 1
    assert _syncs(sync, 12) == {3: [(0, AFTER_LAST_ACTION)], 7: [(0, AFTER_LAST_ACTION)],
                                11: [(0, AFTER_LAST_ACTION)]}


def test_streaming_spreads_the_fragments_over_the_window():
    sync = GradientSync(mode="streaming", inner_steps=6, fragments=3)
    assert _syncs(sync, 12) == {1: [(0, AFTER_LAST_ACTION)], 3: [(1, AFTER_LAST_ACTION)],
                                5: [(2, AFTER_LAST_ACTION)], 7: [(0, AFTER_LAST_ACTION)],
                                9: [(1, AFTER_LAST_ACTION)], 11: [(2, AFTER_LAST_ACTION)]}


def test_an_overlapped_fragment_runs_beside_the_next_inner_step():
    sync = GradientSync(mode="streaming", inner_steps=4, fragments=2, overlap_steps=1)
    # fragment 0 after inner step 2 (iteration 1): its all-reduce runs in iteration 2
    assert _syncs(sync, 8) == {2: [(0, AT_START)], 4: [(1, AT_START)], 6: [(0, AT_START)]}


@pytest.mark.parametrize("dtype,numel", [("fp32", 1000), ("bf16", 500), ("int8", 250),
                                         ("int4", 125)])
def test_the_outer_dtype_sets_the_bytes_on_the_wire(dtype, numel):
    sync = GradientSync(mode="diloco", outer_dtype=dtype)
    assert sync.wire_numel(1000, 0) * 4 == numel * 4 == 1000 * {"fp32": 4, "bf16": 2,
                                                                  "int8": 1, "int4": 0.5}[dtype]


def test_fragments_cover_the_parameters_once():
    sync = GradientSync(mode="streaming", inner_steps=8, fragments=3)
    pieces = [sync.fragment_numel(1001, f) for f in range(3)]
    assert pieces == [(0, 334), (334, 334), (668, 333)]


@pytest.mark.parametrize("fields,words", [
    ({"mode": "diloco", "fragments": 2}, "fragments applies to mode streaming"),
    ({"mode": "diloco", "overlap_steps": 1}, "overlap_steps applies to mode streaming"),
    ({"mode": "streaming", "inner_steps": 2, "fragments": 3}, "fragments=3 needs as many"),
    ({"mode": "streaming", "overlap_steps": 2}, "less than or equal to 1"),
    ({"mode": "diloco", "outer_dtype": "fp8"}, "'fp32', 'bf16', 'int8' or 'int4'"),
])
def test_contradicting_fields_are_refused(fields, words):
    with pytest.raises(ValidationError) as e:
        GradientSync(**fields)
    assert words in str(e.value)


BASE = """\
name: lc
topology:
  name: lc
  dcs: [{name: a, hosts: 1}, {name: b, hosts: 1}]
  inter_dc: {delay_ms: 10, rate_mbit: 100}
workload:
  parallel: {pp: 1, dp: 2}
  schedule: gpipe
  microbatches: 2
  compute: {mode: COMPUTE, forward_ms: 5, backward_ms: 10}
  gradient_sync: SYNC
  iterations: ITERATIONS
  warmup: 1
placement: dp_across_dcs
"""


@pytest.mark.parametrize("sync,compute,iterations,words", [
    ("{mode: diloco, inner_steps: 10}", "emulated", 6,
     "no outer sync among the measured iterations 1..5"),
    ("{mode: streaming, inner_steps: 2, fragments: 3}", "real", 6,
     "fragments=3 needs as many inner_steps, got 2"),
])
def test_validate_refuses_a_mode_that_cannot_run_in_one_line(tmp_path, sync, compute, iterations,
                                                             words):
    f = tmp_path / "lc.yaml"
    f.write_text(BASE.replace("SYNC", sync).replace("COMPUTE", compute)
                 .replace("ITERATIONS", str(iterations)))
    r = subprocess.run([sys.executable, "-m", "testbed", "validate", str(f)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.splitlines()[-1] == "1 problem found"


def test_one_pipeline_has_nothing_to_synchronise(tmp_path):
    f = tmp_path / "lc.yaml"
    f.write_text(BASE.replace("SYNC", "{mode: diloco, inner_steps: 2}")
                 .replace("COMPUTE", "emulated").replace("ITERATIONS", "6")
                 .replace("dp: 2", "dp: 1"))
    r = subprocess.run([sys.executable, "-m", "testbed", "validate", str(f)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "needs dp > 1" in r.stderr, r.stderr
