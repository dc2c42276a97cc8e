"""The report of a sweep whose rows lack a metric (a program that reports only its iteration
time has no bubble) writes an empty cell and the plots it can, never a crash. No root."""
from __future__ import annotations


HEAD = ("experiment,run_id,cell_id,repeat,status,error,links.inter_dc.delay_ms,backend,shaper,"
        "placement,placement_stage_dcs,schedule,executor,compute_mode,schedule_rule,pp,dp,"
        "chunks,microbatches,iteration_time_s,throughput_tokens_s,metrics_source,"
        "iteration_basis")
ROWS = ["t,r,c1,0,ok,,0,netns,delayline,in_order,dc1 dc2,1f1b,ir,real,,4,1,1,8,0.5,100,"
        "regex,printed",
        "t,r,c2,0,ok,,20,netns,delayline,in_order,dc1 dc2,1f1b,ir,real,,4,1,1,8,0.7,80,"
        "regex,printed"]


def test_a_delay_sweep_of_rows_without_bubble_is_reported_and_plotted(tmp_path):
    (tmp_path / "results.csv").write_text("\n".join([HEAD, *ROWS]) + "\n")
    from testbed.report.report import build_report  # matplotlib: not at collection
    written = {p.name for p in build_report(tmp_path)}
    assert written == {"summary.md", "iteration_vs_delay.png"}  # no bubble plot: no bubble
    assert "c2" in (tmp_path / "summary.md").read_text()
