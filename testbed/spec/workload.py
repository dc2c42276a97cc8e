"""The training job of an experiment: :class:`Workload` and its sections (model, parallelism,
compute, filler, program). What they cost (sizes, FLOPs, times) is ``testbed.spec.costs``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, model_validator

from testbed.spec.gradsync import GradientSync, first_measured_sync
from testbed.spec.program import Program
from testbed.topology import Strict
from testbed.schedule.registry import CROSS_DC_SCHEDULES, SCHEDULES



class ModelSpec(Strict):
    """A GPT-style decoder's size."""

    layers: int = Field(8, ge=1, le=1024)
    hidden: int = Field(1024, ge=8, le=65536)
    heads: int = Field(16, ge=1, le=1024)
    seq_len: int = Field(1024, ge=1, le=1_048_576)
    vocab: int = Field(32000, ge=2, le=1_048_576)

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> "ModelSpec":
        if self.hidden % self.heads:
            raise ValueError(f"heads={self.heads} must divide hidden={self.hidden}")
        return self


# The most ranks a cell may have (what-if predictions, docs/simulator.md).
MAX_RANKS = 131_072


class Parallel(Strict):
    """Pipeline stages (pp) × data-parallel replicas (dp); ``workload.ranks_per_host`` ranks
    share each host."""

    pp: int = Field(4, ge=1, le=128)
    dp: int = Field(1, ge=1, le=MAX_RANKS, description=f"replicas; pp × dp ≤ {MAX_RANKS:,}")


class Compute(Strict):
    """Real forward/backward, or emulated: each F/B/W takes a modelled time (per virtual stage,
    per microbatch) while tensors of the true shapes cross the network."""

    mode: Literal["emulated", "real"] = "emulated"
    forward_ms: float | None = Field(None, gt=0, le=600_000)
    backward_ms: float | None = Field(None, gt=0, le=600_000, description="full backward B")
    weight_ms: float | None = Field(None, gt=0, le=600_000,
                                    description="W part of B for split schedules (default B/2)")
    device: Literal["a100", "h100"] | None = Field(
        None, description="emulated times from FLOPs / (peak × mfu) instead of forward_ms")
    mfu: float = Field(0.4, gt=0, le=1)
    bytes_scale: float = Field(1.0, gt=0, le=1,
                               description="shrink activation and gradient tensors by this "
                                           "factor; link rates are not changed: give them as "
                                           "real rate × bytes_scale to keep serialization times")
    dtype: Literal["float32", "bfloat16"] = "float32"

    @model_validator(mode="after")
    def _times_known(self) -> "Compute":
        if self.mode == "emulated" and self.device is None and (
                self.forward_ms is None or self.backward_ms is None):
            raise ValueError("emulated compute needs forward_ms and backward_ms, or a device")
        if self.weight_ms is not None and self.backward_ms is not None \
                and self.weight_ms >= self.backward_ms:
            raise ValueError(f"weight_ms={self.weight_ms} must be below backward_ms="
                             f"{self.backward_ms} (W is part of B)")
        return self


class Filler(Strict):
    """Bubble filling (BubbleTea-style): prefill requests of a small inference model, run by each
    rank only inside idle gaps it measured at the same wait in the previous iteration."""

    model: ModelSpec = Field(default_factory=lambda: ModelSpec(layers=2, hidden=256, heads=4,
                                                               seq_len=128, vocab=1000))
    prompt_tokens: int = Field(128, ge=1, le=1_048_576, description="tokens per prefill request")
    mode: Literal["emulated", "real"] | None = Field(
        None, description="real: a torch.no_grad() forward of the model; emulated: sleep "
                          "prefill_ms; default: as workload.compute.mode")
    prefill_ms: float = Field(5.0, gt=0, le=600_000,
                              description="modelled time of one prefill request (emulated mode)")
    margin_ms: float = Field(2.0, ge=0, le=600_000,
                             description="safety margin: a request starts only if it is expected "
                                         "to end this long before the predicted end of the gap")

    @model_validator(mode="after")
    def _prompt_fits(self) -> "Filler":
        if self.prompt_tokens > self.model.seq_len:
            raise ValueError(f"prompt_tokens={self.prompt_tokens} exceeds the filler model's "
                             f"seq_len={self.model.seq_len}: lower it or raise model.seq_len")
        return self


# the schedule name of a workload whose schedule comes from workload.schedule_file
CUSTOM_SCHEDULE = "custom"
class Workload(Strict):
    """The training job run in every cell."""

    model: ModelSpec = Field(default_factory=ModelSpec)
    parallel: Parallel = Field(default_factory=Parallel)
    schedule: str = Field("1f1b", description="one of: " + ", ".join(
        [*SCHEDULES, *CROSS_DC_SCHEDULES]))
    schedule_file: str | None = Field(
        None, description="your own schedule instead of schedule: a compute-only .csv as "
                          "torch.distributed.pipelining writes it, or a .py defining "
                          "schedule(pp, chunks, microbatches, context) (relative to the "
                          "experiment file)")
    program: Program | None = Field(None, description="run this program on every rank "
                                                      "instead of the built-in worker")
    chunks: int = Field(1, ge=1, le=16, description="virtual stages per rank")
    ranks_per_host: int = Field(
        1, ge=1, le=64,
        description="ranks on each host (a lab node with this many GPUs): consecutive ranks "
                    "placed in a DC fill one host before the next; each gets LOCAL_RANK and, "
                    "where the host has GPUs, CUDA_VISIBLE_DEVICES=<LOCAL_RANK>; transfers "
                    "between ranks of one host are not shaped")
    microbatches: int = Field(8, ge=1, le=4096)
    microbatch_size: int = Field(1, ge=1, le=4096)
    executor: Literal["ir", "torch"] = "ir"
    connections: int = Field(1, ge=1, le=64,
                             description="TCP connections per P2P transfer (ir executor): each "
                                         "activation/gradient is split over this many, as Atlas "
                                         "does on window-limited high-RTT links")
    compute: Compute = Field(default_factory=lambda: Compute(forward_ms=20, backward_ms=40))
    dist_backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="the built-in worker's process-group backend: auto is nccl where "
                            "the rank has a GPU (CUDA), else gloo; with nccl the tensors live "
                            "on the rank's GPU and cross between emulated hosts over NCCL's "
                            "socket transport (docs/howto/gpus.md)")
    unshaped_rdma: bool = Field(
        False, description="let NCCL use InfiniBand or RoCE on lab hosts whose interface "
                           "towards the other DCs has it; that traffic bypasses tc, so the "
                           "row lists those hosts in unshaped_rdma_hosts (default: a cell "
                           "NCCL could carry over them is refused, exit 2; "
                           "docs/howto/gpus.md)")
    wan_sharing: Literal["fair", "temporal"] = Field(
        "fair", description="how the pipelines of several replicas share an inter-DC link "
                            "direction they all cross: fair (all start together, their "
                            "transfers share the link as TCP does) or temporal (replica d "
                            "starts d slots late, a slot being one activation's time on the "
                            "busiest shared link direction, so their transfers take turns, "
                            "each at the link's whole rate; docs/howto/data-parallel.md)")
    gradient_sync: GradientSync = Field(default_factory=GradientSync,
                                        description="the data-parallel all-reduce (dp > 1)")
    memory_limit: int | None = Field(
        None, ge=1, le=4096, description="most microbatches of activations a stage may hold; "
                                         "the cross-DC schedules (geopipe, crosspipe_*) are "
                                         "built within it (None: no limit)")
    filler: Filler | None = Field(None, description="optional inference prefill run only inside "
                                                    "measured idle gaps (ir executor)")
    iterations: int = Field(6, ge=1, le=100_000, description="total, warm-up included")
    warmup: int = Field(1, ge=0, le=100_000)
    seed: int = Field(0, ge=0, le=2**32 - 1, description="of the weights and the data")
    lr: float = Field(1e-3, gt=0)
    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)

    @property
    def world_size(self) -> int:
        return self.parallel.pp * self.parallel.dp

    @model_validator(mode="before")
    @classmethod
    def _schedule_or_file(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("schedule_file") is not None:
            if "schedule" in data and data["schedule"] != CUSTOM_SCHEDULE:
                raise ValueError("schedule and schedule_file are mutually exclusive: give one")
            data = dict(data, schedule=CUSTOM_SCHEDULE)
        return data

    def set_base_dir(self, base: Path) -> None:
        """Where relative paths (schedule_file, the program's files) start: the experiment
        file's directory."""
        self._base_dir = Path(base)

    @property
    def base_dir(self) -> Path:
        return self._base_dir

    @property
    def schedule_path(self) -> Path | None:
        """``schedule_file`` resolved against the experiment file's directory."""
        return None if self.schedule_file is None else self._base_dir / self.schedule_file

    @property
    def schedule_known(self) -> bool:
        """Whether the schedule that runs is known: always for the built-in worker; for a
        program only when the file names one (schedule or schedule_file)."""
        return self.program is None or "schedule" in self.model_fields_set

    @model_validator(mode="after")
    def _options_need_ir(self) -> "Workload":
        if self.schedule in CROSS_DC_SCHEDULES and self.executor != "ir":
            raise ValueError(f"{self.schedule} needs executor: ir (torch's schedule classes "
                             "have no cross-DC-aware schedules)")
        if self.connections > 1 and self.executor != "ir":
            raise ValueError(f"connections={self.connections} needs executor: ir (the torch "
                             "executor sends each tensor on one connection)")
        if self.program is not None and self.filler is not None:
            raise ValueError("filler runs inside the built-in worker: remove it or program")
        if self.dist_backend == "nccl":
            _check_nccl(self)
        if self.filler is not None and self.executor != "ir":
            raise ValueError("filler needs executor: ir (the torch executor's waits are inside "
                             "torch.distributed.pipelining, out of the filler's reach): set "
                             "executor: ir or remove filler")
        if self.gradient_sync.outer:
            _check_outer(self)
        return self

    @property
    def filler_mode(self) -> str | None:
        """How the filler runs: its own mode, else the training compute's; None without one."""
        if self.filler is None:
            return None
        return self.filler.mode or self.compute.mode


def _check_outer(w: Workload) -> None:
    """What the low-communication modes need (docs/howto/low-communication.md)."""
    sync, mode = w.gradient_sync, f"gradient_sync.mode {w.gradient_sync.mode}"
    needs = [(w.parallel.dp < 2, "dp > 1 (replicas to synchronise)"),
             (w.executor != "ir", "executor: ir"),
             (w.program is not None, "the built-in worker (a program syncs as it is written)")]
    missing = [what for bad, what in needs if bad]
    if missing:
        raise ValueError(f"{mode} needs {'; '.join(missing)}")
    if first_measured_sync(sync, w.warmup, w.iterations) is None:
        raise ValueError(f"{mode} with inner_steps={sync.inner_steps} has no outer sync among "
                         f"the measured iterations {w.warmup}..{w.iterations - 1}: raise "
                         "iterations or lower inner_steps")


def _check_nccl(w: Workload) -> None:
    """What the built-in worker does not yet run over NCCL (docs/howto/gpus.md)."""
    unsupported = [(w.executor != "ir", "executor: torch"), (w.filler is not None, "filler"),
                   (w.parallel.dp > 1, "dp > 1"), (w.connections > 1, "connections > 1")]
    named = [what for bad, what in unsupported if bad]
    if named and w.program is None:
        raise ValueError(f"dist_backend: nccl does not run with {', '.join(named)} yet: use "
                         "dist_backend: gloo (or auto on hosts without GPUs)")


def shared_gpu_problem(ranks: int, gpus: int) -> str:
    """Why real compute over NCCL is refused when ``ranks`` processes share ``gpus`` GPUs."""
    return (f"compute.mode: real over NCCL with {ranks} ranks sharing {gpus} GPU(s): the "
            "stages' kernels and NCCL's waiting kernels of several processes on one GPU hung "
            "in the first iteration (seen on an H200); give each rank its own GPU, or use "
            "emulated compute, which runs over NCCL on a shared GPU")
