"""Wire bytes per step by group, and their α-β time, on one GPU of one pipeline stage (the planner asks for the
stage ``tpsim.plan.memory.busiest_stage`` picks, the one holding the most bytes: its own collectives, no other's).

**TP** comes from ``tpsim.predict.formulas.predict_step`` — the function every live run's FORMULA CHECK compares
its trace with — called for one micro-batch of a one-layer model of the architecture (``ModelSpec.config``):
the rows of block 0 (``transformer.h.0``, ``model.layers.0``) are one layer (plain TP 8·b·s·h·(t−1)/t elements,
Narayanan et al. 2021; SP the same bytes as all-gathers and reduce-scatters plus tpsim's re-gathers and
norm-gradient syncs: [2, h] for a LayerNorm, [h] for Llama's RMSNorm), the other rows the embedding, the loss
and the LM head. Llama's layer has the same f/g pattern (Megatron-LM splits its attention and SwiGLU MLP as it
does GPT's); when tp exceeds the KV heads, each replicated KV head's weight gradients [2, h, d] are all-reduced
over its tp/kv copies (group "kv", on the TP link), as tpsim.tp.gqa_attention does — gradients, so the planner
prices them at the layout's gradient bytes (fp32 main gradients under bf16), where ``predict_step`` given an
itemsize prices every tensor at that size; the loss's reductions, float32 under 16 bits, likewise.
Full recompute repeats each layer's forward collectives in the backward (Korthikanti et al. 2022, §5, "from the
paper": tpsim does not recompute); selective recompute adds none.

Which stage issues what (Megatron-LM's pipeline): every stage its L/p layers and the clip norm's all-reduce once
a step; the first stage the embedding's collectives; the last the final norm's SP gradient sync, the LM head's
and the loss's; tpsim's batch broadcast, ids and labels as one int64 [2, b, s], is split as Megatron-LM's
``get_batch`` splits it: the ids on the first stage, the labels on the last, half each. With p = 1 the one stage
does all of it. A row of ``predict_step``
that no stage claims raises, so a new collective cannot be dropped silently.

**DP**: the gradients of this GPU's parameters, all-reduced once per step (one bucket) over the dp·cp ranks
that hold them (context parallelism's ranks average their gradients too); with ``--zero 1`` reduce-scattered,
then the updated parameters all-gathered (Megatron-LM's distributed optimizer, sharded over DP × CP); ZeRO-2
moves the same bytes (Rajbhandari et al. 2019 §7: it only frees the gradients a rank does not own). ZeRO-3
(parameters sharded) all-gathers each piece's parameters before its forward and again before its backward and
reduce-scatters its gradients after its backward, every micro-batch: m × (2 gathers + 1 reduce-scatter) of the
stage's parameters a step — at m = 1 and one dtype 3·(d − 1)/d·N, 1.5× DDP's all-reduce 2·(d − 1)/d·N (§7);
under a pipeline or gradient accumulation m times that, since nothing is kept between micro-batches. Under
context parallelism every activation term — TP's collectives, the p2p boundary — is that of the s/cp tokens a
CP rank holds; CP's own messages are ``tpsim.plan.cp_terms``'s.

**PP**: the stage's sends in the schedule's own action lists (``tpsim.pipeline.stage_clock``): under AFAB,
1F1B and ZB-H1 m activations forward (all but the last stage) and m gradients backward (all but the first);
interleaved, one of each per micro-batch and chunk except at the model's two ends, so rank 0 and rank p − 1
send m·(2v − 1), the others 2·m·v, 2·m·(v·p − 1) in the pipeline. Each is b·s·h elements (÷ t under SP,
where the boundary tensor is split); what a stage receives is counted as its neighbour's send. Their time is
not priced here: the messages run on the virtual clock (``tpsim.plan.pipeline``), which says how much of them
the schedule exposes.

**Embedding** (p > 1, tied embeddings: GPT-2): the first stage's word embedding and the last stage's LM head are
one weight held twice, so after the last backward their gradients are summed over Megatron-LM's embedding group
(``_allreduce_word_embedding_grads``; tpsim.live_pipeline.step's ``allreduce_word_embedding_grads``): one all-reduce of
the [V/t, h] shard (V padded to a multiple of t) at the layout's gradient bytes over a group of 2 — wire bytes
2·(2 − 1)/2 = 1 × its bytes, α-β time on the PP link — issued by a GPU of the first and of the last stage only.

Links: TP on the node's link when the TP group fits in a node, else the inter-node link; CP while tp·cp GPUs
do, PP while tp·cp·pp GPUs fit in a node (Megatron's order puts TP fastest, then CP, PP outermost), DP while
the whole job does. A DP or CP group that spans nodes is a ``tpsim.nccl.SpanningLink``: its collectives (DP's
all-reduce, CP's all-gather, reduce-scatter and Ulysses' all-to-all) as NCCL runs them over the NICs of its
ranks in each node, its point-to-point sends (the CP ring's) α + β·bytes on one NIC.
"""

from __future__ import annotations

from dataclasses import replace

from tpsim.cost import alpha_beta_time, ring_steps, wire_bytes
from tpsim.nccl import SpanningLink
from tpsim.partition import padded_vocab_size
from tpsim.phases import FORWARD
from tpsim.pipeline.collectives import per_chunk
from tpsim.pipeline.stage_clock import compiled
from tpsim.gpus import GPU
from tpsim.plan.layout import Layout, rank_layers
from tpsim.plan.memory import ACT_BYTES, STATE_BYTES
from tpsim.plan.models import ModelSpec
from tpsim.config import RunConfig, dtype_name
from tpsim.predict.formulas import Prediction, predict_step

PER_STEP = ("clip_grad_norm",)  # once per step, not per micro-batch


def tp_rows(model: ModelSpec, lay: Layout, dtype: str | None = None) -> list[Prediction]:
    """``predict_step``'s TP rows (groups tp and kv) for one micro-batch of a one-layer model of ``model``."""
    name = dtype_name(dtype or lay.dtype)
    e, grad = ACT_BYTES[name], STATE_BYTES[name][1]
    one_layer = model.config(layers=1, max_positions=lay.local_seq)  # a CP rank's s/cp tokens
    run = RunConfig.of(one_layer, tp=lay.tp, sp=lay.sp, batch_size=lay.micro_batch, seq_len=lay.local_seq)
    rows = predict_step(run, clip=True, itemsize=e)
    loss = max(e, 4)  # the vocab-parallel cross-entropy reduces in float32 under 16 bits (Megatron: logits.float())
    return [_repriced(r, e, grad) if r.group == "kv" else _repriced(r, e, loss) if r.layer == "loss" else r
            for r in rows if r.group in ("tp", "kv")]


def _repriced(r: Prediction, itemsize: int, grad: int) -> Prediction:
    """A row priced at ``grad`` bytes an element, not ``itemsize`` (the replicated KV heads' gradients; the
    loss's float32 reductions)."""
    n = r.bytes // itemsize * grad
    return replace(r, bytes=n, wire_bytes=wire_bytes(r.op, n // (r.calls or 1), r.group_size) * (r.calls or 1))


def in_first_layer(model: ModelSpec, r: Prediction) -> bool:
    """Is ``r`` a collective of the model's first block (every block issues the same ones)?"""
    return r.layer.startswith(f"{model.architecture.config.layer_names.block}.0.")


def tp_layer_rows(model: ModelSpec, lay: Layout, dtype: str | None = None) -> list[Prediction]:
    """One layer's TP collectives for one micro-batch, with full recompute's repeated forward ones."""
    rows = [r for r in tp_rows(model, lay, dtype) if in_first_layer(model, r)]
    if lay.recompute == "full":
        rows += [r for r in rows if r.phase == FORWARD]
    return rows


def tp_wire_bytes_per_layer(model: ModelSpec, lay: Layout, dtype: str | None = None) -> int:
    return sum(r.wire_bytes for r in tp_layer_rows(model, lay, dtype))


def rows_seconds(rows, link) -> float:
    """The α-β seconds of ``rows`` (predicted collectives, each ``calls`` times) one after another on ``link``."""
    t = 0.0
    for r in rows:
        t = alpha_beta_time((r.calls or 1) * ring_steps(r.op, r.group_size), r.wire_bytes, link.alpha, link.beta, t)
    return t


def ring_seconds(op: str, nbytes: int, size: int, link) -> float:
    """One collective ``op`` of ``nbytes`` over ``size`` ranks on ``link``: steps·α + wire bytes·β inside a node;
    for a group that spans nodes (``tpsim.nccl.SpanningLink``) NCCL's own choice of ring or tree."""
    if hasattr(link, "collective"):
        return link.collective(op, nbytes, size)
    return alpha_beta_time(ring_steps(op, size), wire_bytes(op, nbytes, size), link.alpha, link.beta)


def links(lay: Layout, gpu: GPU) -> dict:
    """Which link each group uses (see the module docstring)."""
    one_node, inner = lay.gpus <= lay.gpus_per_node, lay.tp * lay.cp  # TP fastest, then CP
    per_node = max(1, min(lay.dp, lay.gpus_per_node // inner))  # DP ranks of one group in a node
    cp_per_node = max(1, lay.gpus_per_node // lay.tp)  # CP ranks of one group in a node, when it spans nodes
    return {"tp": gpu.intra if lay.tp <= lay.gpus_per_node else gpu.inter,
            "cp": gpu.intra if inner <= lay.gpus_per_node else SpanningLink(gpu.inter, gpu.fabric, cp_per_node),
            "pp": gpu.intra if inner * lay.pp <= lay.gpus_per_node else gpu.inter,
            "dp": gpu.intra if one_node else SpanningLink(gpu.inter, gpu.fabric, per_node)}


def tied_head_elements(model: ModelSpec, lay: Layout) -> int:
    """ZeRO-3 at pp 1: the tied LM head shares the embedding's weight on the one stage, and gathers it for its own
    forward and backward as well (``tpsim.train.zero3``): its elements on a TP rank (0 where it does not apply)."""
    if not lay.zero_stage.gathers_around_units or lay.pp > 1 or not model.tied:
        return 0
    return padded_vocab_size(model.vocab, lay.tp) // lay.tp * model.hidden


def dp_collectives(lay: Layout, stage_params: int, tied_head: int = 0) -> list[tuple[str, int]]:
    """``(op, logical bytes)`` of the DP traffic per step: an all-reduce of the gradients; with ZeRO-1 a
    reduce-scatter of the gradients and an all-gather of the updated parameters; ZeRO-2 the same at one
    micro-batch, and with m of them m reduce-scatters (each micro-batch's gradients into the owned slices: the
    whole gradient is never kept); with ZeRO-3 every micro-batch's reduce-scatter and its two all-gathers of the
    parameters, before each piece's forward and again before its backward (module docstring), and a tied head's
    two more of the embedding's weight (``tied_head`` elements: ``tied_head_elements``). How many of each a step
    is counted from the schedule's own collective actions (``tpsim.pipeline.collectives.per_chunk``: the pass
    that places them on the live run's lists): REDUCE_GRAD for the gradients, UNSHARD for the parameters."""
    p_bytes, g_bytes, _ = STATE_BYTES[lay.dtype]
    stage = lay.zero_stage
    split = compiled(lay.schedule, lay.pp, lay.microbatches, lay.vp).splits_backward
    n = per_chunk(stage, lay.microbatches, split)  # the schedule's REDUCE_GRAD and UNSHARD actions of one chunk
    grads = (stage.grad_collective, n["REDUCE_GRAD"] * stage_params * g_bytes)  # ZeRO-2/3: m, into owned slices
    if stage.gathers_around_units:
        return [grads, ("all_gather", n["UNSHARD"] * (stage_params + tied_head) * p_bytes)]
    if stage.gathers_after_step:
        return [grads, ("all_gather", n["UNSHARD"] * stage_params * p_bytes)]
    return [grads]


def dp_wire_bytes(lay: Layout, stage_params: int, tied_head: int = 0) -> int:
    return sum(wire_bytes(op, n, lay.grad_replicas) for op, n in dp_collectives(lay, stage_params, tied_head))


def _ends(model: ModelSpec, lay: Layout, stage: int) -> list[Prediction]:
    """The TP rows outside the layers that ``stage`` issues per micro-batch (the module docstring's split)."""
    return end_rows(model, lay, stage == 0, stage == lay.pp - 1)


def end_rows(model: ModelSpec, lay: Layout, first: bool, last: bool, rows: list[Prediction] | None = None, *,
             batch: bool = True) -> list[Prediction]:
    """The TP rows outside the layers of the model's ``first`` and/or ``last`` stage per micro-batch, from
    ``rows`` (default ``tp_rows``); ``batch=False`` leaves out the batch broadcast (read before the step)."""
    names, out = model.architecture.config.layer_names, []
    for r in tp_rows(model, lay) if rows is None else rows:
        if in_first_layer(model, r) or r.layer in PER_STEP:
            continue
        if r.layer == "batch":  # [2, b, s]: ids for the first stage, labels for the last
            half = replace(r, bytes=r.bytes // 2, wire_bytes=r.wire_bytes // 2)
            out += [half] * (first + last) * batch
        elif r.layer == names.embed:
            out += [r] * first
        elif r.layer in (names.final_norm, "lm_head", "loss"):
            out += [r] * last
        else:
            raise ValueError(f"tpsim.plan.comm: no pipeline stage claims predict_step's row {r.layer} ({r.op})")
    return out


def pp_sends(lay: Layout, stage: int) -> int:
    """Point-to-point sends per step of one GPU of ``stage``: its rank's SENDs in the schedule (module
    docstring)."""
    return compiled(lay.schedule, lay.pp, lay.microbatches, lay.vp).sends[stage]


def boundary_bytes(model: ModelSpec, lay: Layout) -> int:
    """One point-to-point message: a micro-batch's [s, b, h] activation or its gradient ([s/t, b, h] under SP)."""
    return lay.micro_batch * lay.local_seq * model.hidden * ACT_BYTES[lay.dtype] // (lay.tp if lay.sp else 1)


EMBEDDING_GROUP = 2  # the first and the last pipeline stage


def embedding_collectives(model: ModelSpec, lay: Layout, stage: int) -> list[tuple[str, int]]:
    """``(op, logical bytes)`` of the tied embedding's gradient sync a GPU of ``stage`` joins per step: one
    all-reduce of its [V/t, h] gradient shard on the first and the last stage when p > 1 (module docstring)."""
    if not (model.tied and lay.pp > 1 and stage in (0, lay.pp - 1)):
        return []
    shard = padded_vocab_size(model.vocab, lay.tp) // lay.tp * model.hidden
    return [("all_reduce", shard * STATE_BYTES[lay.dtype][1])]


def step_comm(model: ModelSpec, lay: Layout, gpu: GPU, stage: int, stage_params: int) -> dict[str, dict[str, float]]:
    """``{"wire_bytes": {"tp", "dp", "pp", "embedding"}, "time_s": {"tp", "dp", "embedding"}}`` per step on one
    GPU of ``stage``, which holds ``stage_params`` parameters: that stage's own collectives only (the module
    docstring; PP's time is the virtual clock's)."""
    if not 0 <= stage < lay.pp:
        raise ValueError(f"stage {stage} of a {lay.pp}-stage pipeline")
    m, per_stage, link = lay.microbatches, rank_layers(model, lay)[stage], links(lay, gpu)
    layer, ends = tp_layer_rows(model, lay), _ends(model, lay, stage)
    once = [r for r in tp_rows(model, lay) if r.layer in PER_STEP]
    tp_wire = m * (per_stage * sum(r.wire_bytes for r in layer) + sum(r.wire_bytes for r in ends))
    tp_wire += sum(r.wire_bytes for r in once)
    tp_time = m * (per_stage * rows_seconds(layer, link["tp"]) + rows_seconds(ends, link["tp"])) \
        + rows_seconds(once, link["tp"])
    tied = tied_head_elements(model, lay)
    dp_ops = dp_collectives(lay, stage_params, tied)
    dp_wire = dp_wire_bytes(lay, stage_params, tied)
    dp_time = sum(ring_seconds(op, n, lay.grad_replicas, link["dp"]) for op, n in dp_ops)
    emb = embedding_collectives(model, lay, stage)
    emb_wire = sum(wire_bytes(op, n, EMBEDDING_GROUP) for op, n in emb)
    emb_time = sum(ring_seconds(op, n, EMBEDDING_GROUP, link["pp"]) for op, n in emb)
    return {"wire_bytes": {"tp": tp_wire, "dp": dp_wire, "pp": pp_sends(lay, stage) * boundary_bytes(model, lay),
                           "embedding": emb_wire},
            "time_s": {"tp": tp_time, "dp": dp_time, "embedding": emb_time}}
