"""The end-of-run table in a non-TTY log (120 columns): every number whole, no header cut;
and `bash setup.sh` (the quickstart) through a pipe shows every number of its end table."""
from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from testbed.report.console import end_cells, print_results

ROOT = Path(__file__).resolve().parents[1]


class _Store:
    csv_path = Path("results.csv")
    root = Path("run")


def _wide_table(lines: int = 4) -> pd.DataFrame:
    """A cell table as the report makes it, with many axes and long values."""
    rows = []
    for k in range(lines):
        rows.append({"cell_id": f"c{k:08x}", "links.inter_dc.delay_ms": "2xTF",
                     "workload.schedule": "crosspipe_greedy", "workload.memory_limit": 6,
                     "placement_stage_dcs": "east east mid mid west west", "status": "ok",
                     "n": 30, "iteration_time_s": 12.345678 + k, "iteration_time_s_lo": 12.1,
                     "iteration_time_s_hi": 13.9, "bubble_ratio": 0.5123, "bubble_ratio_lo":
                     0.5011, "bubble_ratio_hi": 0.5301, "throughput_tokens_s": 123456.7,
                     "exposed_comm_s": 0.4826, "predicted_iteration_time_s": 11.98,
                     "predicted_bubble_ratio": 0.547})
    return pd.DataFrame(rows)


def _printed(table: pd.DataFrame, width: int = 120) -> str:
    buf = io.StringIO()
    print_results(Console(file=buf, width=width, force_terminal=False), _Store(), table)
    return buf.getvalue()


def test_every_number_and_header_of_a_wide_table_fits_120_columns_uncut():
    table = _wide_table()
    out = _printed(table)
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 120
    for texts in end_cells(table).values():
        for text in texts:
            assert text in out, text
    for header in ("iter s", "95% CI", "bubble", "tokens/s", "pred iter s"):
        assert header in out.replace("\n", " ") or all(w in out for w in header.split())


def _numbers(text: str) -> set[str]:
    return set(re.findall(r"\d+\.\d+|\d{3,}", text))


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.torch
def test_setup_sh_through_a_pipe_shows_every_number_of_the_end_table():
    res = subprocess.run(["bash", "setup.sh"], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=1200,
                         env={k: v for k, v in os.environ.items() if k != "COLUMNS"})
    run_dir = re.search(r"^run (\S+): ", res.stdout, re.M)
    try:
        assert res.returncode == 0, res.stdout[-3000:]
        assert "…" not in res.stdout
        table_part = res.stdout[res.stdout.index("results"):]
        assert max(len(line) for line in table_part.splitlines()) <= 120
        df = pd.read_csv(Path(ROOT, run_dir.group(1)) / "results.csv")
        for v in df["iteration_time_s"]:
            assert f"{v:.3f}" in table_part, (v, table_part)
        for v in df["throughput_tokens_s"]:
            assert f"{v:.0f}" in table_part, (v, table_part)
    finally:
        if run_dir:
            shutil.rmtree(Path(ROOT, run_dir.group(1)), ignore_errors=True)
