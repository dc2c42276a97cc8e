"""The results row: every column of ``results.csv``, owned here and imported everywhere else.

Order (the contract in docs/architecture.md): the head, then every swept parameter by its
dotted path, then the body, then one group of columns per inter-DC link.
"""
from __future__ import annotations

from typing import Any

from testbed.topology import ResolvedLink

HEAD = ["experiment", "run_id", "cell_id", "repeat", "status", "error"]
# what the cell was: settings that every row has, swept or not
# placement_map: the DC of every (replica, stage), replicas separated by "|" (testbed.plan.grid);
# gradient_sync: the DP all-reduce's algorithm (empty for dp = 1);
# unshaped_rdma_hosts: the hosts on which NCCL was let use InfiniBand/RoCE, which no shaper
# sees (workload.unshaped_rdma; testbed.launch.rdma), space-separated; empty when none
SETTINGS = ["backend", "shaper", "unshaped_rdma_hosts", "placement", "placement_stage_dcs",
            "placement_map", "gradient_sync", "schedule", "executor", "compute_mode",
            "schedule_rule", "pp", "dp", "chunks", "microbatches"]
MEASURED = ["iteration_time_s", "iteration_time_p95_s", "bubble_ratio", "bubble_ratio_max",
            "bubble_ratio_megatron", "wall_time_per_iteration_s", "throughput_tokens_s",
            "throughput_samples_s", "iteration_throughput_tokens_s",
            "iteration_throughput_samples_s", "exposed_comm_s"]
PREDICTED = ["predicted_iteration_time_s", "predicted_bubble_ratio", "predicted_exposed_comm_s",
             "predicted_peak_inflight"]
# with dp > 1 (testbed.readout.dataparallel): the all-reduce's time the ranks waited for after
# their last action, and the rest of it, which ran beside their pipeline work
DATA_PARALLEL = ["allreduce_exposed_s", "predicted_allreduce_exposed_s", "allreduce_hidden_s",
                 "predicted_allreduce_hidden_s"]
# diloco/streaming (testbed.readout.outer): the mode's settings, the sustained iteration time,
# compute over wall time, the outer syncs' count, stall and time, their payload and the WAN
# bytes per inner step
LOW_COMMUNICATION = ["gradient_sync_mode", "inner_steps", "outer_dtype", "fragments",
                     "overlap_steps", "mean_iteration_time_s", "predicted_mean_iteration_time_s",
                     "compute_utilization", "predicted_compute_utilization", "outer_syncs",
                     "outer_sync_stall_s", "predicted_outer_sync_stall_s", "outer_sync_s",
                     "predicted_outer_sync_s", "outer_sync_payload_bytes",
                     "wan_bytes_per_step_measured", "wan_bytes_per_step_planned",
                     "wan_headers_per_step_measured"]
FILLER = ["filler_basis", "utilization", "training_utilization", "filler_requests_per_s",
          "filler_tokens_per_s", "filler_overrun_s"]
# metrics_source: how the measured columns were obtained (testbed.readout.program);
# iteration_basis: what iteration_time_s is: span (ranks aligned at iteration starts: the
# built-in worker), period (a rank's start to its next start: programs; testbed.readout.traces) or
# printed (the program's own times, iteration_regex);
# exit_status: a program's ranks at exit: ok, or what a rank that had finished its iterations
# did instead (hung and was stopped, or exited non-zero): the measurements stand;
# wall_time_s: from starting the workers to the last one's exit;
# network_setup_s, measure_links_s: this cell's time building (or re-shaping) its network and
# measuring its links (0 when the cell before left both as needed);
# network: the tag of the network the cell ran on (cells in a row with one topology share it);
# links_measured_in: the cell/repeat whose link measurement these link columns are (made once
# per link state and network: testbed.runner.livenet)
BOOKKEEPING = ["metrics_source", "iteration_basis", "exit_status", "wall_time_s",
               "iterations_measured", "delayline_drops", "delayline_late_releases",
               "delayline_releases", "queue_drops", "network",
               "links_measured_in", "network_setup_s", "measure_links_s", "started_at",
               "duration_s"]
# self-fidelity (testbed.readout.fidelity): the verdict, the checks behind it, what it could not
# check, and its signals
FIDELITY = ["fidelity", "fidelity_failed", "fidelity_unchecked", "compute_overshoot_p50_ms",
            "compute_overshoot_p99_ms", "compute_stretch_pct", "late_starts", "cpu_busy_pct",
            "predicted_gap_pct"]
# a program's control run (testbed.readout.control): its iteration time and bubble over
# loopback, what the emulated network added to them, its compute stretch, or why it failed
CONTROL = ["control_iteration_time_s", "control_bubble_ratio", "network_added_s",
           "network_added_bubble", "compute_vs_control_pct", "control_error"]
# NCCL (testbed.readout.nccl): the worker's backend, the transports NCCL connected over, any
# that bypassed the emulated links, the most ranks on one GPU, and one activation's read-back
# across the DC boundary
NCCL = ["dist_backend", "nccl_transports", "nccl_bypass", "ranks_per_gpu",
        "activation_readback_s", "activation_readback_expected_s", "activation_readback_error_pct"]
# a controller in the loop (testbed.readout.controlled): its policy, the decisions that changed
# a rate, the measured iterations it was late for, whether the shaper had every rate it set
CONTROLLER = ["controller_policy", "controller_changes", "controller_late",
              "controller_readback_ok"]
# backend cluster (testbed.net.cluster): which DCs each machine carried ("m1:dc0+dc1 m2:dc2"),
# the underlay's own round trip and TCP rate between machines a tunnel joins (the worst pair),
# and the tunnels' MTU
CLUSTER = ["cluster_machines", "underlay_rtt_ms", "underlay_rate_mbit", "tunnel_mtu"]
BODY = (SETTINGS + MEASURED + PREDICTED + DATA_PARALLEL + LOW_COMMUNICATION + FILLER + CONTROL
        + NCCL + CONTROLLER + CLUSTER + BOOKKEEPING + FIDELITY)
LINK_PREFIX = "link_"
STATUSES = ("ok", "failed", "skipped")

# the headline metrics
METRICS = ["iteration_time_s", "bubble_ratio", "throughput_tokens_s", "exposed_comm_s"]


def is_link_column(name: str) -> bool:
    return name.startswith(LINK_PREFIX)


def ordered(columns: list[str]) -> list[str]:
    """``columns`` in contract order: head, swept parameters, body, link columns."""
    head = [c for c in HEAD if c in columns]
    body = [c for c in BODY if c in columns]
    links = sorted(c for c in columns if is_link_column(c))
    params = [c for c in columns if c not in head + body + links]
    return head + params + body + links


def swept(columns: list[str]) -> list[str]:
    """The swept parameters among ``columns``: neither head, body nor link columns."""
    fixed = set(HEAD) | set(BODY)
    return [c for c in columns if c not in fixed and not is_link_column(c)]


def link_columns(link: ResolvedLink, measured: dict[str, float | None]) -> dict[str, Any]:
    """The columns of one inter-DC link: configured and measured RTT (ms) and rate (Mbit/s)."""
    p = f"{LINK_PREFIX}{link.name}_"
    return {
        p + "rtt_ms_configured": link.a_to_b.one_way_delay_ms + link.b_to_a.one_way_delay_ms,
        p + "rtt_ms_measured": measured.get("rtt_ms"),
        p + "rtt_ms_p99_measured": measured.get("rtt_ms_p99"),
        p + "rate_mbit_configured": link.a_to_b.rate_mbit,
        p + "rate_mbit_measured": measured.get("rate_mbit"),
    }
