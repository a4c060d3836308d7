"""A layout: how a training run is split (tp × cp × pp × dp GPUs) and what each GPU computes per step.

The divisibility rules are the ones a Megatron-style run enforces: attention is split by heads (grouped KV heads
split too, or replicated when tp is a multiple of them), the MLP's columns by ``tp``; ``pp`` stages take equal
numbers of layers unless ``stage_layers`` says how many each takes (Llama-3 405B's one fewer on the first and the
last stage); the global batch splits into ``dp`` replicas × ``m`` micro-batches of ``micro_batch`` sequences;
sequence parallelism splits the sequence by tp. The pipeline runs ``schedule`` (``tpsim.pipeline.schedules``:
afab, 1f1b, interleaved, zb-h1) with ``vp`` model chunks per rank (interleaved): the model is cut into
pp × vp *virtual stages*, chunk c of rank r being virtual stage c·pp + r (Megatron-LM's layout), and
``stage_layers`` lists the layers of each virtual stage in model order. Context parallelism (``cp``) cuts every
sequence over cp ranks, each holding s/cp tokens of every layer (``local_seq``); the sequence must cut into the
layout's chunks and Ulysses' heads over cp (``tpsim.cp.choice``, the live run's own rules); the gradients are
averaged over the dp·cp ranks holding the same model shard (``grad_replicas``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from tpsim.config import DTYPE_ALIASES, Parallelism, dtype_alias
from tpsim.cp import choice as cp_choice
from tpsim.config.tp_overlap_choice import tp_comm_overlap_problem
from tpsim.errors import ConfigError
from tpsim.gpus import GPUS
from tpsim.pipeline.schedules import ONE_CHUNK, SCHEDULES
from tpsim.plan.models import ModelSpec
from tpsim.predict import pipeline as pipeline_formula

DTYPES = ("bfloat16", "float16", "float32")  # the planner prices these (``bf16``, ``fp16``, ``fp32`` accepted)
DTYPE_CHOICES = (*DTYPES, *(a for a, name in DTYPE_ALIASES.items() if name in DTYPES))
RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("unfused", "fused")
# ZeRO stages the planner prices (tpsim.zero_stage.ZERO_STAGES: all run live): 2 shards the gradients too,
# 3 the parameters as well (Rajbhandari et al. 2019, §5); a Layout is never Parallelism.check-ed, so these pass
PLANNED_ZERO_STAGES = (0, 1, 2, 3)
# What a Layout shares with a run's other parts (tpsim.config.RunConfig), by name: Layout field -> (the run's
# part, its field). Every ``Parallelism`` field is the Layout's own (a Layout *is* the run's Parallelism, so a new
# axis needs no entry here); these are the rest, read by ``of_run`` (``Layout.of_run``); the micro-batch is the
# run's ``micro_batch`` (its DP rank's rows ÷ micro-batches). The planner's defaults stay its own (a real run's
# sizes: 2048 tokens, bfloat16), the demo's its own (a tiny model's).
RUN_FIELDS = {
    "seq_len": ("schedule", "seq_len"),
    "global_batch": ("schedule", "batch_size"),
    "dtype": ("precision", "dtype"),
    "schedule": ("pipeline", "schedule"),
    "vp": ("pipeline", "vp"),
    "stage_layers": ("pipeline", "stage_layers"),
    "mfu": ("pipeline", "mfu"),
    "overlap_grad_reduce": ("optimizer", "overlap_grad_reduce"),
    "overlap_param_gather": ("optimizer", "overlap_param_gather"),
    "bucket_mb": ("optimizer", "bucket_mb"),
}


@dataclass(frozen=True)
class Layout(Parallelism):
    """A ``tpsim.config.Parallelism`` (every field a live run's grid has, inherited, none restated) with what the
    planner adds: activation recomputation, the batch, the dtype, the GPU and how many share a node, the MFU. The
    fields shared with the run's other parts are named in ``RUN_FIELDS``; ``Layout.of_run`` reads them."""

    recompute: str = "none"
    seq_len: int = 2048
    micro_batch: int = 1
    global_batch: int = 512
    dtype: str = "bfloat16"
    gpu: str = "h100-80gb"
    gpus_per_node: int | None = None  # GPUs one NVLink domain joins; None: the GPU's (8, an NVL72's 72)
    mfu: float | None = None  # None: each kernel from its shape (tpsim.plan.kernel_time); a number: flat
    schedule: str = "1f1b"
    vp: int = 1
    stage_layers: tuple[int, ...] | None = None  # layers of each virtual stage; None: L / (pp·vp) each
    gemm_efficiency: float | None = None  # None: tpsim.plan.kernel_time's fitted GEMM_EFFICIENCY
    hbm_efficiency: float | None = None  # None: its fitted HBM_EFFICIENCY
    p2p_scatter_gather: bool = True  # Megatron's: each TP rank sends 1/t of a message, NVLink all-gathers it
    fp8: bool = False  # ``--dtype fp8``: the layers' weight matmuls in FP8, everything else bfloat16
    fp8_recipe: str = "delayed"  # how FP8 scales are found (FP8_RECIPES): what each cast reads and writes
    fp8_gemm_speedup: float | None = None  # None: tpsim.plan.kernel_time's fitted FP8_GEMM_SPEEDUP
    attention: str = "unfused"  # "fused": a flash-style kernel (no s² scores in memory)
    overlap_grad_reduce: bool = False  # DP gradient buckets reduced during the last backward (Megatron's flag)
    overlap_param_gather: bool = False  # ZeRO-1's parameter all-gather hidden under the next forward
    tp_comm_overlap: bool = False  # SP's all-gather / reduce-scatter pipelined with the neighbouring GEMMs
    bucket_mb: float | None = None  # DP bucket cap in MiB (0: one a tensor); None: Megatron-LM's rule (dp_overlap)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", dtype_alias(self.dtype))  # one spelling; unknown names: problems()
        if self.gpus_per_node is None:  # the GPU's NVLink domain (an unknown GPU: 8, and plan() names it)
            object.__setattr__(self, "gpus_per_node", GPUS[self.gpu].nvlink_domain if self.gpu in GPUS else 8)
        if self.stage_layers is not None:
            object.__setattr__(self, "stage_layers", tuple(self.stage_layers))

    @property
    def gpus(self) -> int:
        return self.world  # tp × cp × pp × dp

    @property
    def local_seq(self) -> int:
        """Tokens of each sequence one CP rank holds: s / cp (s without context parallelism)."""
        return self.seq_len // self.cp

    @property
    def microbatches(self) -> int:
        """``m``: micro-batches per replica per step (gradient accumulation steps)."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def in_flight(self) -> int:
        """Micro-batches (interleaved: (micro-batch, chunk) pairs) whose activations the first stage holds at its
        peak under the schedule (``tpsim.predict.pipeline``; 1F1B min(p, m))."""
        return pipeline_formula.peak_in_flight(self.schedule, self.pp, self.microbatches, self.vp)[0]

    def as_dict(self) -> dict:
        return dict(asdict(self), gpus=self.gpus, microbatches=self.microbatches, in_flight=self.in_flight)

    @property
    def parallel(self) -> Parallelism:
        """The run's part of the layout: what ``tpsim.config.RunConfig`` holds as ``parallel``."""
        return Parallelism(**{f.name: getattr(self, f.name) for f in fields(Parallelism)})

    @classmethod
    def of_run(cls, run, **planner) -> Layout:
        """The layout of a ``tpsim.config.RunConfig``: its ``Parallelism`` whole, the ``RUN_FIELDS`` from its other
        parts, its micro-batch; ``planner``: the planner's own fields (gpu, recompute, ...), or one to override."""
        shared = {name: getattr(getattr(run, part), field) for name, (part, field) in RUN_FIELDS.items()}
        return cls(**{**{f.name: getattr(run.parallel, f.name) for f in fields(Parallelism)}, **shared,
                      "micro_batch": run.micro_batch, **planner})


def virtual_stage_layers(model: ModelSpec, lay: Layout) -> tuple[int, ...]:
    """Layers of each of the pp·vp virtual stages, in model order (``stage_layers``, or L / (pp·vp) each)."""
    return lay.stage_layers or (model.layers // (lay.pp * lay.vp),) * (lay.pp * lay.vp)


def rank_layers(model: ModelSpec, lay: Layout) -> tuple[int, ...]:
    """Layers each pipeline rank holds: the sum over its chunks (virtual stages c·pp + r)."""
    per = virtual_stage_layers(model, lay)
    return tuple(sum(per[c * lay.pp + r] for c in range(lay.vp)) for r in range(lay.pp))


def pipeline_problems(model: ModelSpec, lay: Layout) -> list[str]:
    """The schedule, vp and stage rules ``lay`` breaks (part of ``problems``)."""
    if lay.schedule not in SCHEDULES:
        return [f"--schedule {lay.schedule}: unknown (one of {', '.join(SCHEDULES)})"]
    if lay.vp < 1:
        return [f"--vp {lay.vp}: must be >= 1"]
    out, stages = [], lay.pp * lay.vp
    if lay.vp > 1 and lay.schedule in ONE_CHUNK:
        out.append(f"--schedule {lay.schedule} runs one model chunk per rank: --vp {lay.vp} needs interleaved")
    if lay.vp > 1 and lay.pp == 1:
        out.append(f"--vp {lay.vp}: model chunks interleave over a pipeline, give --pp > 1")
    whole = lay.global_batch % (lay.dp * lay.micro_batch) == 0  # else problems() has said so
    if lay.schedule == "interleaved" and lay.vp > 1 and whole and lay.microbatches % lay.pp:
        m, per_m = lay.microbatches, lay.dp * lay.micro_batch
        out.append(f"--schedule interleaved --vp {lay.vp}: {m} micro-batches (global batch / (dp x micro-batch)) "
                   f"must be a multiple of --pp {lay.pp} (micro-batches go through the chunks in groups of pp; "
                   f"try --global-batch {(m + lay.pp - m % lay.pp) * per_m})")
    if lay.stage_layers is None:
        if model.layers % stages:
            out.append(f"layers {model.layers} not divisible by pp {lay.pp}" + (f" x vp {lay.vp}" if lay.vp > 1
                                                                                 else "") + " (give --pp-layers)")
    elif len(lay.stage_layers) != stages or min(lay.stage_layers) < 1 or sum(lay.stage_layers) != model.layers:
        out.append(f"--pp-layers {','.join(map(str, lay.stage_layers))}: {stages} stages (pp x vp) of at least one "
                   f"layer each, {model.layers} layers in all")
    return out


def problems(model: ModelSpec, lay: Layout) -> list[str]:
    """Every rule ``lay`` breaks for ``model`` (empty: the layout is valid)."""
    out = []
    if min(lay.tp, lay.pp, lay.dp, lay.cp, lay.micro_batch, lay.seq_len, lay.global_batch) < 1:
        out.append("tp, cp, pp, dp, micro-batch, sequence length and global batch must be >= 1")
        return out
    for what, n in (("heads", model.heads), ("ffn columns", model.ffn)):
        if n % lay.tp:
            out.append(f"{what} {n} not divisible by tp {lay.tp}")
    if model.kv_heads % lay.tp and lay.tp % model.kv_heads:  # KV heads are split, or replicated on tp/kv ranks
        out.append(f"kv heads {model.kv_heads} and tp {lay.tp}: neither divides the other")
    if lay.global_batch % (lay.dp * lay.micro_batch):
        out.append(f"global batch {lay.global_batch} not divisible by dp {lay.dp} x micro-batch {lay.micro_batch}")
    out += pipeline_problems(model, lay)
    if lay.sp and lay.seq_len % lay.tp:
        out.append(f"sequence length {lay.seq_len} not divisible by tp {lay.tp} (sequence parallelism)")
    if tp_comm_overlap_problem(lay):
        out.append(tp_comm_overlap_problem(lay))
    if lay.zero not in PLANNED_ZERO_STAGES:
        out.append(f"--zero {lay.zero}: the planner models ZeRO stages {', '.join(map(str, PLANNED_ZERO_STAGES))}")
    if lay.recompute not in RECOMPUTE:
        out.append(f"--recompute {lay.recompute!r}: one of {', '.join(RECOMPUTE)}")
    if lay.dtype not in DTYPES:
        out.append(f"--dtype {lay.dtype!r}: one of {', '.join(DTYPES)}")
    if lay.mfu is not None and not 0 < lay.mfu <= 1:
        out.append(f"--mfu {lay.mfu}: must be in (0, 1]")
    for name, x in (("--gemm-efficiency", lay.gemm_efficiency), ("--hbm-efficiency", lay.hbm_efficiency)):
        if x is not None and not 0 < x <= 1:
            out.append(f"{name} {x}: must be in (0, 1]")
    if lay.attention not in ATTENTION:
        out.append(f"--attention {lay.attention!r}: one of {', '.join(ATTENTION)}")
    if lay.fp8 and lay.dtype != "bfloat16":
        out.append(f"--dtype fp8 runs the matmuls in FP8 and keeps the rest in bfloat16, not {lay.dtype}")
    out += fp8_problems(lay)
    if lay.overlap_param_gather and not (lay.zero in PLANNED_ZERO_STAGES
                                         and lay.zero_stage.overlap_param_gather_applies):
        out.append("--overlap-param-gather overlaps ZeRO-1/2's parameter all-gather after the step: it needs --zero 1 "
                   "or 2 (ZeRO-3 gathers each layer before its forward and backward instead)")
    return out + cp_problems(model, lay)


FP8_RECIPES = ("delayed", "current", "blockwise", "mxfp8")  # tpsim.plan.kernels.FP8_CAST_BYTES prices each
MX_GPUS = ("b200", "gb200", "gb300")  # Blackwell: tensor cores that take MXFP8's 32-element block scales


def fp8_problems(lay: Layout) -> list[str]:
    """The FP8 knobs' rules: a known recipe, MXFP8 only where the tensor cores read its block scales, a speed-up
    over the 16-bit GEMM in [1, 2] (an FP8 GEMM does twice the 16-bit work a cycle at most)."""
    out = []
    if lay.fp8_recipe not in FP8_RECIPES:
        out.append(f"--fp8-recipe {lay.fp8_recipe!r}: one of {', '.join(FP8_RECIPES)}")
    elif lay.fp8 and lay.fp8_recipe == "mxfp8" and lay.gpu in GPUS and lay.gpu not in MX_GPUS:
        out.append(f"--fp8-recipe mxfp8 needs Blackwell tensor cores ({', '.join(MX_GPUS)}); the {lay.gpu} has "
                   "none (Hopper runs FP8 with per-tensor or blockwise scales: delayed, current, blockwise)")
    if lay.fp8_gemm_speedup is not None and not 1 <= lay.fp8_gemm_speedup <= 2:
        out.append(f"--fp8-gemm-speedup {lay.fp8_gemm_speedup}: must be in [1, 2] (an FP8 GEMM over the 16-bit one)")
    if not lay.fp8 and (lay.fp8_recipe != "delayed" or lay.fp8_gemm_speedup is not None):
        out.append("--fp8-recipe and --fp8-gemm-speedup price FP8 matmuls: they need --dtype fp8")
    return out


def cp_problems(model: ModelSpec, lay: Layout) -> list[str]:
    """The context-parallel rules ``lay`` breaks, in the live run's words (``tpsim.cp.choice``): the names, then
    the first size rule broken (the sequence in 2·cp zigzag chunks or cp shards, s/cp by tp under SP, Ulysses'
    query and KV heads per TP rank by cp)."""
    for rule in (lambda: cp_choice.check_names(lay.cp_comm, lay.cp_layout),
                 lambda: cp_choice.check_sizes(lay, model, lay.seq_len)):
        try:
            rule()
        except ConfigError as err:
            return [str(err)]
    return []


def check(model: ModelSpec, lay: Layout) -> Layout:
    bad = problems(model, lay)
    if bad:
        cp = f" cp {lay.cp}" if lay.cp != 1 else ""
        raise ConfigError(f"{model.name} at tp {lay.tp}{cp} pp {lay.pp} dp {lay.dp}: " + "; ".join(bad))
    return lay
