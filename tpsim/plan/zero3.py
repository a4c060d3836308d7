"""ZeRO stages 2 and 3 in the planner's model state: what a GPU keeps of each parameter, and ZeRO-3's gathered
pieces (Rajbhandari et al. 2019, arXiv:1910.02054, §5 and Figure 1).

**Bytes per parameter** of the (params, grads, optimizer) columns ``p, g, o`` (``tpsim.plan.memory.STATE_BYTES``)
over the d = dp·cp ranks that average the gradients (``Layout.grad_replicas``):

    stage 0  p + g + o                 plain data parallelism: everything on every rank
    stage 1  p + g + o/d               P_os: the optimizer state sharded (Megatron's distributed optimizer)
    stage 2  p + (g + o)/d             P_os+g: the gradients reduce-scattered into each rank's owned slice
    stage 3  (p + g + o)/d             P_os+g+p: the parameters sharded too

In the paper's accounting (mixed precision, 2 + 2 + K with K = 12) 16 → 4 + 12/d → 2 + 14/d → 16/d; with
Megatron's bf16 recipe (float32 main gradients: 2 + 4 + 12) 18 → 6 + 12/d → 2 + 16/d → 18/d; tpsim's float64
live layout (AdamW in place, 8 + 8 + 16) 32 → 16 + 16/d → 8 + 24/d → 32/d.

**ZeRO-2 and micro-batches.** The gradient column is the owned slice (g/d) only if the whole gradient is
never kept: each bucket reduce-scattered as the backward fills it, into the owned slice, and freed. At one
micro-batch a step that is ZeRO-1's bytes (Rajbhandari et al. §7). With m > 1 micro-batches (a pipeline, or
gradient accumulation) the planner keeps the g/d column and so charges m reduce-scatters a step, one a
micro-batch, accumulating into the owned slices, each on the comm stream as its backward finishes the bucket
(``tpsim.plan.dp_overlap``) — DeepSpeed's ZeRO-2 and FSDP's SHARD_GRAD_OP do so; the
alternative, keeping the whole buffer until the last micro-batch, moves ZeRO-1's bytes with ZeRO-1's gradient
memory, which ``--zero 1`` already prices. The transient buckets (one or two, of ``--bucket-mb``) are not counted.

**ZeRO-3's pieces in flight.** Each *piece* of a stage — the embedding (first stage), every layer, the head (last
stage: the final norm and the LM head, unless a tied head is the embedding itself on one stage) — is
all-gathered just before its forward and again before its backward, freed after use. With the next piece's
gather prefetched, a GPU holds two pieces' full parameters at once, and in the backward their full gradients
before each one's reduce-scatter: the transient

    gathered = 2 · w · (p_bytes + g_bytes)          w: the stage's largest piece (its TP shard's elements)

counted with the activations (none at d = 1, where nothing is sharded). MPI-free.
"""

from __future__ import annotations

from tpsim.partition import padded_vocab_size
from tpsim.plan.layout import Layout, virtual_stage_layers
from tpsim.plan.models import ModelSpec
from tpsim.zero_stage import zero_stage

IN_FLIGHT = 2  # the piece being computed and the one prefetched


def sharded_state(p: float, g: float, o: float, zero: int, d: int) -> tuple[float, float, float]:
    """``(params, grads, optimizer)`` bytes per parameter one rank holds at ZeRO ``zero`` over ``d`` ranks."""
    stage = zero_stage(zero)
    return (p / d if stage.shards_params else p), (g / d if stage.shards_grads else g), \
        (o / d if stage.shards_optimizer else o)


def piece_elements(model: ModelSpec, lay: Layout, stage: int) -> list[int]:
    """The elements of each ZeRO-3 piece of virtual stage ``stage`` on one TP rank, in forward order (module
    docstring): the embedding on the first, its layers, the head on the last."""
    arch, last = model.architecture, lay.pp * lay.vp - 1
    vocab = padded_vocab_size(model.vocab, lay.tp) // lay.tp * model.hidden
    layer = arch.memory.layer_param_elements(model, lay.tp)
    out = [layer] * virtual_stage_layers(model, lay)[stage]
    if stage == 0:
        out.insert(0, vocab + (model.positions * model.hidden if arch.config.position_table else 0))
    if stage == last:
        out.append(arch.config.norm_params * model.hidden + (0 if model.tied and lay.pp == 1 else vocab))
    return out


def gathered_bytes(model: ModelSpec, lay: Layout, rank: int, p_bytes: float, g_bytes: float) -> float:
    """ZeRO-3's transient on pipeline rank ``rank`` (module docstring): two of its largest pieces' full
    parameters and gradients; 0 below stage 3 or when nothing is sharded (d = 1)."""
    if not lay.zero_stage.shards_params or lay.grad_replicas == 1:
        return 0.0
    widest = max(max(piece_elements(model, lay, c * lay.pp + rank)) for c in range(lay.vp))
    return float(IN_FLIGHT * widest * (p_bytes + g_bytes))


def piece_buckets(model: ModelSpec, lay: Layout, stage: int) -> list[tuple[list[int], list[int]]]:
    """Each ZeRO-3 piece of virtual stage ``stage`` in forward order as a live run moves it (``tpsim.train.zero3``:
    one bucket a unit, padded to a multiple of d): ``(gathered, scattered)``, the elements of each bucket its
    pieces all-gather before F and B, and of each bucket its backward reduce-scatters. The embedding's units
    (the token table, a learned position table) and the head's (the final norm, the LM head) are a bucket each;
    a tied LM head gathers the embedding's bucket for itself (its own weight is that one), and under a pipeline
    the tied weight's bucket on the first and last stage is *held*: reduce-scattered once after its sum over
    the embedding group (``held_bucket``), not in the backward."""
    arch, last, d = model.architecture, lay.pp * lay.vp - 1, lay.grad_replicas

    def pad(n: int) -> int:
        return -(-n // d) * d

    vocab = pad(padded_vocab_size(model.vocab, lay.tp) // lay.tp * model.hidden)
    layer = pad(arch.memory.layer_param_elements(model, lay.tp))
    out = [([layer], [layer]) for _ in range(virtual_stage_layers(model, lay)[stage])]
    held = model.tied and lay.pp > 1
    if stage == 0:
        embed = [vocab] + ([pad(model.positions * model.hidden)] if arch.config.position_table else [])
        out.insert(0, (embed, embed[1:] if held else embed))
    if stage == last:
        norm = pad(arch.config.norm_params * model.hidden)
        out.append(([norm, vocab], [norm] if model.tied else [norm, vocab]))
    return out


def held_bucket(model: ModelSpec, lay: Layout, stage: int) -> int:
    """Elements of the tied embedding's held bucket on virtual stage ``stage`` (``piece_buckets``): the first
    and the last stage under a pipeline, else 0."""
    if not model.tied or lay.pp == 1 or stage not in (0, lay.pp * lay.vp - 1):
        return 0
    return -(-(padded_vocab_size(model.vocab, lay.tp) // lay.tp * model.hidden) // lay.grad_replicas) \
        * lay.grad_replicas
