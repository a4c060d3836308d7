"""What a run is, in one frozen object: the grid, the model, the precision, the optimizer, the schedule, the files.

    RunConfig
      model        GPTConfig | LlamaConfig      the architecture and its sizes (``tpsim.arch``)
      parallel     Parallelism(tp, dp, pp, sp, zero, tp_comm_overlap, cp, cp_comm, cp_layout)   how ranks split work
      precision    Precision(dtype, loss_scale_interval)
      optimizer    OptimizerSettings(lr, clip, bucket_mb, max_skipped_steps, overlap_grad_reduce, overlap_param_gather)
      schedule     Schedule(batch_size, seq_len, steps, seed, dropout_rng)
      files        Files(out, export, init_from, timeline_steps, save, resume)
      pipeline     Pipeline(schedule, microbatches, vp, stage_layers, clock, mfu)   how pp > 1 runs (live_pipeline)

It is built and validated once (the demo's command line does it in ``tpsim.demo.cli``, tests and lessons with
``RunConfig.of``) and then only read: the model builders, the optimizer set-up, ``predict_step`` and the planner
take it or one of its parts; nothing derives a field into it later. ``plan.Layout`` is a ``Parallelism`` with the
planner's own fields added, so a layout and a run say "tp", "sp" and "zero" the same way. A new parallel axis is
one field of ``Parallelism``; how a pipeline runs (schedule, micro-batches, chunks, layers per stage, clock) is
the ``Pipeline`` part, checked with the rest before any work.

One vocabulary for dtypes (NumPy's names; ``fp32``, ``bf16``, ``fp16``, ``fp64`` accepted, printed in the long
form) and one for architectures (``tpsim.arch``; ``gpt`` accepted). Pure arithmetic, no MPI. Beside it: ``pipeline``,
``experts`` (``Experts``: --ep, --etp, --dispatcher), ``clock_choice`` (``--clock``, ``--mfu``), ``tp_overlap_choice``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from tpsim.arch import ARCH_NAMES, architecture, architecture_of
from tpsim.errors import ConfigError, at_least
from tpsim.nn.precision import DTYPE_NAMES, dtype_of  # DTYPE_NAMES: what --dtype accepts and prints
from tpsim.config import tp_overlap_choice  # pure: --tp-comm-overlap
from tpsim.config.pipeline import Pipeline  # how pp > 1 runs (re-exported: tpsim.config.Pipeline)
from tpsim.config.experts import Experts, has_experts, tell_groups  # noqa: F401 (has_experts: re-exported)
from tpsim.cp import choice as cp_choice  # pure: --cp, --cp-comm, --cp-layout
from tpsim.zero_stage import ZeroStage, zero_stage  # ZeRO's stages as data (every one runs live)

DTYPE_ALIASES = {"fp64": "float64", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DROPOUT_RNGS = ("exact", "megatron")


def dtype_alias(name) -> str:
    """``name`` in the one spelling when it is a known alias (``bf16`` → ``bfloat16``), else as it is — for a
    caller that reports unknown names itself (``tpsim.plan.layout.problems``)."""
    return DTYPE_ALIASES.get(name, name) if isinstance(name, str) else dtype_name(name)


def dtype_name(name) -> str:
    """The one spelling of a dtype: ``bf16`` → ``bfloat16``, ``np.float32`` → ``float32``; ConfigError names the
    choices."""
    if not isinstance(name, str):
        name = np.dtype(name).name
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPE_NAMES:
        raise ConfigError(f"unknown dtype {name!r}: choose from {', '.join(DTYPE_NAMES)} "
                          f"(or {', '.join(DTYPE_ALIASES)})")
    return name


def arch_name(name: str) -> str:
    """The one spelling of an architecture name: ``gpt`` → ``gpt2`` (``tpsim.arch``)."""
    return architecture(name).name


@dataclass(frozen=True)
class Parallelism:
    """How the ranks split the work: ``tp × cp × dp × pp`` ranks, Megatron's order (TP fastest, then CP, then DP,
    PP outermost).

    ``sp``: Megatron sequence parallelism inside the TP group (Korthikanti et al. 2022); ``zero``: the ZeRO
    stage of the optimizer over the DP group (Rajbhandari et al. 2019; 0 = plain DDP). ``cp``: context
    parallelism, the sequence cut over ``cp`` ranks for every layer, attention included (``tpsim.cp``);
    ``cp_comm``: how attention reaches the other shards (ring, allgather, ulysses); ``cp_layout``: which tokens a
    CP rank holds (zigzag: load-balanced under the causal mask; contiguous). Gradients are averaged over the
    DP × CP ranks that hold the same model shard."""

    tp: int = 1
    dp: int = 1
    pp: int = 1
    sp: bool = False
    zero: int = 0
    tp_comm_overlap: bool = False  # SP's collectives pipelined with their GEMMs (tpsim.tp.collective_matmul)
    cp: int = 1
    cp_comm: str = "ring"
    cp_layout: str = "zigzag"

    def check(self) -> "Parallelism":
        """Raise ``ConfigError`` naming the first size a run cannot have (a ``plan.Layout`` lists them all
        instead: ``tpsim.plan.layout.problems``)."""
        for name in ("tp", "dp", "pp", "cp"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be >= 1, got {getattr(self, name)}")
        zero_stage(self.zero)  # ConfigError naming the stages
        tp_overlap_choice.check_tp_comm_overlap(self)
        cp_choice.check_names(self.cp_comm, self.cp_layout)
        return self

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def zero_stage(self) -> ZeroStage:
        """What ``zero`` shards and when its collectives run (``tpsim.zero_stage``), chosen here once."""
        return zero_stage(self.zero)

    @property
    def grad_replicas(self) -> int:
        """Ranks holding the same model shard, over which gradients are averaged: dp × cp."""
        return self.dp * self.cp


@dataclass(frozen=True)
class Precision:
    """The model's dtype; 16-bit means Megatron's mixed precision (float32 main parameters and gradients),
    float16 with dynamic loss scaling (``loss_scale_interval`` clean steps before the scale doubles)."""

    dtype: str = "float64"
    loss_scale_interval: int = 1000

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        at_least(1, loss_scale_interval=self.loss_scale_interval)

    @property
    def numpy(self):
        """The ``np.dtype`` (bfloat16 from ml_dtypes)."""
        return dtype_of(self.dtype)

    @property
    def half(self) -> bool:
        """16-bit parameters and activations (bfloat16 or float16)."""
        return self.dtype in ("bfloat16", "float16")

    @property
    def loss_scaling(self) -> bool:
        """float16 needs the dynamic loss scaler; bfloat16 has float32's range and does not."""
        return self.dtype == "float16"


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW and what surrounds it: ``clip`` the max global gradient norm (0 = off), DDP bucket size in MiB (0 = one
    all-reduce per tensor), non-finite steps in a row that stop the run, Megatron's DP overlaps (guide/overlap.md)."""

    lr: float = 3e-3
    clip: float = 1.0
    bucket_mb: float = 25.0
    max_skipped_steps: int = 3
    weight_decay: float = 0.01
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False

    def __post_init__(self) -> None:
        at_least(0, lr=self.lr, clip=self.clip, bucket_mb=self.bucket_mb, max_skipped_steps=self.max_skipped_steps)

    @property
    def bucket_cap_bytes(self) -> int:
        return int(self.bucket_mb * 2**20)

    @property
    def max_norm(self) -> float | None:
        """The clipping threshold, None when clipping is off."""
        return self.clip if self.clip > 0 else None


@dataclass(frozen=True)
class Schedule:
    """What is computed: ``steps`` optimizer steps on global batches of ``batch_size`` sequences of ``seq_len``
    tokens; ``seed`` draws the master weights, the data and the dropout masks (``dropout_rng``: exact = keyed by
    global position so TP equals serial, megatron = per-rank streams)."""

    batch_size: int = 16
    seq_len: int = 16
    steps: int = 100
    seed: int = 1234
    dropout_rng: str = "exact"

    def __post_init__(self) -> None:
        at_least(1, batch_size=self.batch_size, seq_len=self.seq_len)
        at_least(0, steps=self.steps)
        if self.dropout_rng not in DROPOUT_RNGS:
            raise ConfigError(f"--dropout-rng {self.dropout_rng!r}: one of {', '.join(DROPOUT_RNGS)}")


@dataclass(frozen=True)
class Files:
    """What the run reads and writes: ``out`` (run folder, written by rank 0), ``export`` (step 0's folder),
    ``init_from`` (full parameters to start from), ``timeline_steps`` kept in spans.jsonl and timeline.json,
    ``save`` (the trained model's folder and training checkpoint, written after the last step), ``resume`` (a
    ``save`` folder to continue from: parameters, optimizer state, step)."""

    out: str = "tpsim-out"
    export: str | None = None
    init_from: str | None = None
    timeline_steps: int = 2
    save: str | None = None
    resume: str | None = None

    def __post_init__(self) -> None:
        at_least(0, timeline_steps=self.timeline_steps)


@dataclass(frozen=True)
class RunConfig:
    """One training run, validated as a whole when it is made (see the module docstring)."""

    model: object  # a registered architecture's config (tpsim.arch): GPTConfig, LlamaConfig
    parallel: Parallelism = field(default_factory=Parallelism)
    precision: Precision = field(default_factory=Precision)
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)
    schedule: Schedule = field(default_factory=Schedule)
    files: Files = field(default_factory=Files)
    pipeline: Pipeline = field(default_factory=Pipeline)
    experts: Experts = field(default_factory=Experts)

    def __post_init__(self) -> None:
        architecture_of(self.model)  # TypeError for an unregistered config
        par, sch = self.parallel.check(), self.schedule
        self.pipeline.check(par, self.model.layers, sch.batch_size)
        if sch.batch_size % par.dp:
            raise ConfigError(f"--batch-size {sch.batch_size} is not divisible by dp {par.dp} "
                              f"(each DP rank takes an equal slice of the global batch)")
        if par.sp and sch.seq_len % par.tp:
            raise ConfigError(f"--seq-len {sch.seq_len} is not divisible by tp {par.tp} "
                              f"(sequence parallelism splits the sequence)")
        self.model.check(par.tp)
        self.experts.check(par, self.model, self.precision, self.pipeline)
        cp_choice.check_sizes(par, self.model, sch.seq_len)
        cp_choice.check_clock(par.cp, self.pipeline.clock)
        if self.optimizer.overlap_param_gather and not par.zero_stage.overlap_param_gather_applies:
            raise ConfigError("--overlap-param-gather (ZeRO's all-gather under the next forward) needs --zero 1 or 2")
        self._check_sharded_zero(par)

    def _check_sharded_zero(self, par: Parallelism) -> None:
        """ZeRO-2 and 3 reduce-scatter during the backward (and 3 gathers there): what they do not compose with."""
        z = par.zero
        if not par.zero_stage.reduces_every_microbatch:
            return
        if self.optimizer.overlap_grad_reduce:
            raise ConfigError(f"--overlap-grad-reduce with --zero {z}: ZeRO-{z} reduce-scatters each bucket during "
                              "the backward already, as its layers finish it")
        if self.pipeline.vp > 1:
            raise ConfigError(f"--vp {self.pipeline.vp} with --zero {z}: a bucket shared by two chunks would be "
                              f"reduce-scattered once per chunk's backward; ZeRO-{z} runs with one chunk per stage")

    @property
    def arch(self) -> str:
        """The architecture's one name (``tpsim.arch``)."""
        return architecture_of(self.model).name

    @property
    def dropout(self) -> float:
        """The model's dropout p (0 for an architecture without dropout)."""
        return float(self.model.dropout)

    @property
    def local_batch(self) -> int:
        """Sequences per DP rank per step."""
        return self.schedule.batch_size // self.parallel.dp

    @property
    def micro_batch(self) -> int:
        """Sequences per micro-batch: the DP rank's batch cut into ``pipeline.microbatches``."""
        return self.local_batch // self.pipeline.microbatches

    def serial_model(self):
        """The single-device model from the run's seed and dtype (experts: told where capacity drops, ``experts``)."""
        return tell_groups(architecture_of(self.model).serial(self.model, seed=self.schedule.seed,
                                                              dtype=self.precision.numpy), self)

    def build_model(self, tp_group, cp_group=None):
        """This rank's shard of the run's model over ``tp_group`` (sequence-parallel layers when ``sp``; with
        ``cp_group``, attention across it, ``tpsim.cp``): the serial master drawn from ``schedule.seed``, sharded,
        dropped. Imports the builders (MPI) on first use."""
        from tpsim.cp.context import core_for  # MPI-side, like the builders
        core = core_for(cp_group, self.parallel.cp_comm, self.parallel.cp_layout)  # serial at CP 1
        return architecture_of(self.model).build(self.model, tp_group, self.schedule.seed, self.precision.numpy,
                                                 sequence_parallel=self.parallel.sp,
                                                 tp_comm_overlap=self.parallel.tp_comm_overlap, core=core)

    def replace(self, **parts) -> "RunConfig":
        """A copy with whole parts replaced (validated again), e.g. ``run.replace(parallel=...)``."""
        return replace(self, **parts)

    @classmethod
    def of(cls, model, *, tp: int = 1, dp: int = 1, sp: bool = False, zero: int = 0, dtype: str = "float64",
           batch_size: int = 16, seq_len: int | None = None, steps: int = 1, seed: int = 0, pp: int = 1,
           pipeline: Pipeline | None = None, tp_comm_overlap: bool = False, cp: int = 1, cp_comm: str = "ring",
           cp_layout: str = "zigzag", **optimizer) -> "RunConfig":
        """The short form for tests, lessons and figures: the fields most runs set, the rest at defaults;
        ``seq_len`` defaults to the model's positions; extra keywords go to ``OptimizerSettings``."""
        sch = Schedule(batch_size=batch_size, seq_len=seq_len or model.max_positions, steps=steps, seed=seed)
        return cls(model, Parallelism(tp, dp, pp, sp, zero, tp_comm_overlap, cp, cp_comm, cp_layout), Precision(dtype),
                   OptimizerSettings(**optimizer), sch, pipeline=pipeline or Pipeline())


__all__ = ["ARCH_NAMES", "DTYPE_ALIASES", "DTYPE_NAMES", "Experts", "Files", "OptimizerSettings", "Parallelism", "Pipeline",
           "Precision", "RunConfig", "Schedule", "arch_name", "dtype_name"]
