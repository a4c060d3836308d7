"""A layout: how a training run is split (tp × pp × dp GPUs) and what each GPU computes per step.

The divisibility rules are the ones a Megatron-style run enforces: attention is split by heads (grouped KV heads
split too, or replicated when tp is a multiple of them), the MLP's columns by ``tp``; ``pp`` stages take equal
numbers of layers; the global batch splits into ``dp`` replicas × ``m`` micro-batches of ``micro_batch``
sequences; sequence parallelism splits the sequence by tp.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tpsim.config import DTYPE_ALIASES, Parallelism, dtype_alias
from tpsim.errors import ConfigError
from tpsim.plan.models import ModelSpec

DTYPES = ("bfloat16", "float16", "float32")  # the planner prices these (``bf16``, ``fp16``, ``fp32`` accepted)
DTYPE_CHOICES = (*DTYPES, *(a for a, name in DTYPE_ALIASES.items() if name in DTYPES))
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Layout(Parallelism):
    """A ``tpsim.config.Parallelism`` (tp, dp, pp, sp, zero: the same fields a live run has) with what the
    planner adds: activation recomputation, the batch, the dtype, the GPU and how many share a node, the MFU."""

    recompute: str = "none"
    seq_len: int = 2048
    micro_batch: int = 1
    global_batch: int = 512
    dtype: str = "bfloat16"
    gpu: str = "h100-80gb"
    gpus_per_node: int = 8
    mfu: float = 0.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", dtype_alias(self.dtype))  # one spelling; unknown names: problems()

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def microbatches(self) -> int:
        """``m``: micro-batches per replica per step (gradient accumulation steps)."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def in_flight(self) -> int:
        """Micro-batches whose activations the first stage holds at once under 1F1B: min(p, m)."""
        return min(self.pp, self.microbatches)

    def as_dict(self) -> dict:
        return dict(asdict(self), gpus=self.gpus, microbatches=self.microbatches, in_flight=self.in_flight)

    @property
    def parallel(self) -> Parallelism:
        """The run's part of the layout: what ``tpsim.config.RunConfig`` holds as ``parallel``."""
        return Parallelism(tp=self.tp, dp=self.dp, pp=self.pp, sp=self.sp, zero=self.zero)


def problems(model: ModelSpec, lay: Layout) -> list[str]:
    """Every rule ``lay`` breaks for ``model`` (empty: the layout is valid)."""
    out = []
    if min(lay.tp, lay.pp, lay.dp, lay.micro_batch, lay.seq_len, lay.global_batch) < 1:
        out.append("tp, pp, dp, micro-batch, sequence length and global batch must be >= 1")
        return out
    for what, n in (("heads", model.heads), ("ffn columns", model.ffn)):
        if n % lay.tp:
            out.append(f"{what} {n} not divisible by tp {lay.tp}")
    if model.kv_heads % lay.tp and lay.tp % model.kv_heads:  # KV heads are split, or replicated on tp/kv ranks
        out.append(f"kv heads {model.kv_heads} and tp {lay.tp}: neither divides the other")
    if model.layers % lay.pp:
        out.append(f"layers {model.layers} not divisible by pp {lay.pp}")
    if lay.global_batch % (lay.dp * lay.micro_batch):
        out.append(f"global batch {lay.global_batch} not divisible by dp {lay.dp} x micro-batch {lay.micro_batch}")
    if lay.sp and lay.seq_len % lay.tp:
        out.append(f"sequence length {lay.seq_len} not divisible by tp {lay.tp} (sequence parallelism)")
    if lay.zero not in (0, 1):
        out.append(f"--zero {lay.zero}: the planner models ZeRO stage 0 or 1")
    if lay.recompute not in RECOMPUTE:
        out.append(f"--recompute {lay.recompute!r}: one of {', '.join(RECOMPUTE)}")
    if lay.dtype not in DTYPES:
        out.append(f"--dtype {lay.dtype!r}: one of {', '.join(DTYPES)}")
    if not 0 < lay.mfu <= 1:
        out.append(f"--mfu {lay.mfu}: must be in (0, 1]")
    return out


def check(model: ModelSpec, lay: Layout) -> Layout:
    bad = problems(model, lay)
    if bad:
        raise ConfigError(f"{model.name} at tp {lay.tp} pp {lay.pp} dp {lay.dp}: " + "; ".join(bad))
    return lay
