"""Memory on the busiest GPU: model state per parameter, activations per layer, pipeline micro-batches in flight.

**Model state** (Megatron-LM's distributed-optimizer table, docs/source/api-guide/dist_optimizer.md; bytes per
parameter as (params, grads, optimizer), Adam's two moments and fp32 master copies):

    --dtype bf16   bf16 params, fp32 grads   2 + 4 + 12 (fp32 main params 4, m 4, v 4)               = 18
    --dtype fp16   the same: fp16 runs accumulate their gradients in fp32 (Megatron-LM's
                   --accumulate-allreduce-grads-in-fp32; Korthikanti et al. 2022 count 18). The table's fp16
                   row, 2 + 2 + 16 = 20, keeps a 16-bit gradient beside an fp32 main one
    --dtype fp32   fp32 params, fp32 grads   4 + 4 +  8 (m 4, v 4: no master copy needed)            = 16

With ``--zero 1`` (the distributed optimizer, ZeRO stage 1) the optimizer column is split over the DP group:
18 → 6 + 12/d, 16 → 8 + 8/d; ``--zero 2`` splits the gradients too (18 → 2 + 16/d), ``--zero 3``
the parameters as well (18 → 18/d, plus two gathered pieces in flight: ``tpsim.plan.zero3``). tpsim's live
runs are float64 with AdamW's two slots: 8 + 8 + 16.
The ZeRO paper (Rajbhandari et al. 2019, arXiv:1910.02054, §3.1) counts mixed-precision Adam as 2 + 2 + K with
K = 12 (fp32 params, momentum, variance) = 16 bytes: it keeps 16-bit gradients, where a Megatron run keeps
fp32 ones — hence 16 vs 18, and 4 + 12/d vs 6 + 12/d sharded.

**Activations per layer** (bytes one GPU keeps for the backward of one layer and one micro-batch):

- GPT: exactly Korthikanti et al. 2022 (arXiv:2205.05198), Table 2 — 16-bit activations, 1-byte dropout masks:
  TP sbh(10 + 24/t + 5as/(ht)); TP + SP sbh/t(34 + 5as/h); selective recompute drops the 5as/h attention
  term (sbh(10 + 24/t), sbh·34/t), and so does ``--attention fused`` (a flash-style kernel keeps no scores, only
  each row's float32 log-sum-exp, 4·a·s·b/t bytes); full recompute keeps only the layer's input, 2sbh — its
  sequence shard 2sbh/t under SP (Megatron-LM checkpoints the [s/t, b, h] tensor). Priced at the run's dtype
  through ``tpsim.predict.gpt_memory.korthikanti_layer_elements`` (itemsize per float, 1 per mask).
  tpsim's own extra term, shown apart: LayerNorm's saved rstd, 2bs/r floats (r = t under SP, else 1).
- Llama (RMSNorm, RoPE, grouped-query attention with g KV heads, SwiGLU of f columns, no dropout), derived from
  the architecture in Megatron's way of counting — in elements, 4sbh/r (both norms' inputs and outputs) + 2sbh/t
  (q after RoPE, the context) + 2·s·b·d·g_t (k and v after RoPE; g_t = g/t KV heads a rank, or 1 when t > g and
  they are replicated) + 3sbf/t (gate, up, and their product, the down projection's input) + a·s²·b/t (softmax
  output; removed by selective recompute or fused attention); full recompute keeps sbh (sbh/t under SP).
  tpsim's own extra terms, shown apart:
  RMSNorm's rstd 2bs/r, k and v repeated to every local q head (2sbh/t − 2·s·b·d·g_t), SiLU's output kept beside
  the product (sbf/t) and RoPE's cos/sin tables (2·s·d). Paper + extra is exactly what tpsim's Llama layers cache
  (``--validate``'s Llama cases, with ``tpsim.models.llama``).

Each architecture's count of a layer (its parameters, the paper's activations, tpsim's own extra terms) is its
memory module's (``tpsim.predict.gpt_memory``, ``tpsim.predict.llama_memory``), reached through the registry;
what is built around the layers (embedding, a learned position table, the final norm, the head) is the same
arithmetic for every architecture, from the entry's config class (``positions``, ``norm_params``).

**Context parallelism** (``--cp C``): a CP rank holds s/C tokens of every layer, so every term above is that
of s/C tokens (s → s/C in Korthikanti's formulas and the derivation for Llama; the logits b·(s/C)·V/t·4) but
attention's, whose queries are the rank's and whose keys are the whole sequence's (``tpsim.plan.cp_shape``):

Every variant runs flash-style, as the live ``tpsim.cp`` does (each block's partial attention and log-sum-exp,
the backward recomputing the scores from the output and the lse, ``tpsim.cp.blocks``; TransformerEngine's CP
needs a flash kernel too), whatever ``--attention`` says: the score term (GPT's 5·a·s²·b/t bytes, Llama's
a·s²·b/t elements) is the lse's a·(s/C)·b/t float32 rows (two 16-bit elements each; a float64 run keeps them in
float64), and

- ring: the two K/V receive buffers (the block attended to, the next arriving), 2 × 2·b·g_t·(s/C)·d·e bytes,
  live during one layer's attention: once a GPU (``ring_buffer_bytes``), not per layer;
- allgather: the whole K and V gathered and kept for the backward (it reduce-scatters their gradients and
  gathers nothing again): beyond the rank's own, already in the paper's count, 2·b·(s − s/C)·g_t·d elements a
  layer;
- ulysses: after the all-to-all a rank holds a/(t·C) heads of whole sequences, as many elements as its s/C
  tokens of every head: the paper's s/C-token counts, nothing more.

tpsim's own terms (apart from the paper's, in "total"): its CP core keeps O [b, a/t, s/C, d] beside the output
projection's input (the same numbers, another layout), and K, V only for the KV heads (the serial Llama keeps
them repeated to every query head).

Full recompute keeps b·(s/C)·h (÷ t under SP). CP does not shard the weights: parameters, gradients and Adam's
state per parameter are as above, but ZeRO-1 shards the optimizer over the dp·C ranks that average the
gradients (Megatron's distributed optimizer over DP × CP): 18 → 6 + 12/(d·C).

**Pipeline**: a GPU holds the activations of the micro-batches in flight on its rank — forwards run whose
backward (W, when the backward is split) has not — at the schedule's peak, read off the schedule's own action
lists (``tpsim.pipeline.stage_clock.in_flight_peak``), each (micro-batch, chunk) pair weighing its virtual stage's
layers × one layer's activations. That is Narayanan et al. 2021 (arXiv:2104.04473) §2.2's min(p − i, m)
micro-batches for 1F1B (stage 0 the busiest: L/p layers × p micro-batches, Korthikanti et al. 2022's "L layers'
worth"), m for AFAB, min(p, m) on every stage for ZB-H1 (Qi et al. 2023), and for interleaving rank 0's
2(p − 1) + (v − 1)·p + 1 pairs of L/(pv) layers, L·(1 + (p − 1)/(pv)) layers' worth — Korthikanti et al.'s
factor (``tpsim.predict.pipeline`` has the counts); with uneven ``--pp-layers`` each pair weighs its own layers.
The last stage also holds the loss's fp32 logits, b·s·V/t·4 bytes for one micro-batch. The memory per GPU
counts the paper's layer (what a Megatron-style run keeps); tpsim's own extra terms are reported per layer
only. Every stage is priced (``busiest_stage``): with uneven stages or ZB-H1 a middle one can hold the most.
"""

from __future__ import annotations

from tpsim.config import dtype_name
from tpsim.partition import padded_vocab_size
from tpsim.pipeline.stage_clock import compiled, in_flight_peak
from tpsim.plan.cp_shape import kv_heads_per_rank
from tpsim.plan.layout import Layout, rank_layers, virtual_stage_layers
from tpsim.plan.models import ModelSpec
from tpsim.plan.zero3 import gathered_bytes, sharded_state
from tpsim.predict.model_state import MEGATRON_LAYOUTS, TPSIM_FLOAT64


def _state(layout) -> tuple[int, int, int]:
    """(param, grad, sharded) bytes per parameter of one ``tpsim.predict.model_state`` layout."""
    return layout.param, layout.grad, layout.sharded


# Megatron's dist_optimizer.md rows (one table, defined in tpsim.predict.model_state), plus tpsim's float64
# (the keys are tpsim.config's dtype names; the functions below also take the fp16/bf16/fp32/fp64 aliases).
# float16 takes the bf16 row, 18 bytes: the table's fp16 row (20: a 16-bit gradient beside a float32 main one) is
# not what float16 runs keep — Megatron-LM accumulates and reduces their gradients in float32
# (--accumulate-allreduce-grads-in-fp32, what Korthikanti et al. 2022 count: 2 + 4 + 12), as tpsim's does.
STATE_BYTES = {"float16": _state(MEGATRON_LAYOUTS[1]), "bfloat16": _state(MEGATRON_LAYOUTS[1]),
               "float32": _state(MEGATRON_LAYOUTS[2]), "float64": _state(TPSIM_FLOAT64)}
ZERO_PAPER_STATE_BYTES = (2, 2, 12)  # Rajbhandari et al. 2019: fp16 params and grads, K = 12 optimizer bytes
ACT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def state_bytes_per_param(dtype: str, zero: int = 0, dp: int = 1, table=None) -> dict[str, float]:
    """``{"params", "grads", "optimizer", "total"}`` bytes per parameter over ``dp`` ranks: ZeRO-1 divides the
    optimizer by dp, ZeRO-2 the gradients too, ZeRO-3 the parameters too (``tpsim.plan.zero3``)."""
    p, g, o = sharded_state(*(STATE_BYTES[dtype_name(dtype)] if table is None else table), zero, dp)
    return {"params": p, "grads": g, "optimizer": o, "total": p + g + o}


def layer_param_elements(model: ModelSpec, tp: int) -> int:
    """Parameters of one transformer layer on one TP rank (sharded matrices ÷ t, norms and row biases whole)."""
    return model.architecture.memory.layer_param_elements(model, tp)


def stage_param_elements(model: ModelSpec, tp: int, pp: int, stage: int, layers: int | None = None) -> int:
    """Parameters one GPU of pipeline stage ``stage`` holds: its ``layers`` (default L/p) layers, the embedding(s)
    on the first stage, the final norm and the LM head on the last (a tied head is a second copy there when
    p > 1, as in Megatron-LM)."""
    h, vocab = model.hidden, padded_vocab_size(model.vocab, tp) // tp * model.hidden
    config = model.architecture.config
    n = (model.layers // pp if layers is None else layers) * layer_param_elements(model, tp)
    if stage == 0:
        n += vocab + (model.positions * h if config.position_table else 0)
    if stage == pp - 1:
        n += config.norm_params * h + (0 if model.tied and pp == 1 else vocab)
    return n


def total_params(model: ModelSpec) -> int:
    """Every parameter of the model, unsharded and unpadded, a tied head once."""
    h, V, config = model.hidden, model.vocab, model.architecture.config
    table = model.positions * h if config.position_table else 0
    layers = model.layers * layer_param_elements(model, 1)
    return V * h * (1 if model.tied else 2) + table + layers + config.norm_params * h


def layer_activation_elements(model: ModelSpec, b: int, s: int, t: int, sp: bool, recompute: str,
                              attention: str = "unfused", cp: int = 1,
                              cp_comm: str = "ring") -> tuple[float, float, float]:
    """``(floats, masks, tpsim_extra_floats)`` one layer keeps per micro-batch on one GPU (module docstring):
    the architecture's count, tpsim's norms' rstd (2bs/r) added to its own terms; with ``cp`` > 1 of the s/cp
    tokens a CP rank holds, its attention's terms as ``--cp-comm`` keeps them (module docstring, "Context
    parallelism")."""
    if recompute == "full":  # the layer's input only: under SP its sequence shard (Megatron keeps [s/t, b, h])
        return float(s // cp * b * model.hidden / (t if sp else 1)), 0.0, 0.0
    fused, mine = attention == "fused" or cp > 1, s // cp  # CP: every variant flash-style (tpsim.cp)
    no_scores = recompute == "selective" or fused
    floats, masks, own = model.architecture.memory.paper_layer_elements(model, b, mine, t, sp, no_scores)
    if fused:  # no scores kept; the kernel (the ring's merge) saves each row's float32 log-sum-exp
        floats += 2 * model.heads * mine * b / t  # a·s·b/t of them (a·(s/cp)·b/t a CP rank), two 16-bit each
    if cp > 1:
        kv = 2 * b * mine * kv_heads_per_rank(model, t) * model.head_dim  # this rank's K and V, KV heads only
        own += mine * b * model.hidden / t - (2 * mine * b * model.hidden / t - kv)  # O twice; K, V not repeated
        if cp_comm == "allgather":  # the other ranks' K and V, gathered and kept for the backward
            floats += 2 * b * (s - mine) * kv_heads_per_rank(model, t) * model.head_dim
    return floats, masks, 2 * b * mine / (t if sp else 1) + own


def activation_bytes_per_layer(model: ModelSpec, lay: Layout, dtype: str | None = None) -> dict[str, float]:
    """``{"paper", "tpsim_extra", "total"}`` bytes of one layer, one micro-batch (paper: Korthikanti Table 2 for
    GPT, the derivation above for Llama)."""
    e = ACT_BYTES[dtype_name(dtype or lay.dtype)]
    floats, masks, extra = layer_activation_elements(model, lay.micro_batch, lay.seq_len, lay.tp, lay.sp,
                                                     lay.recompute, lay.attention, lay.cp, lay.cp_comm)
    paper = e * floats + masks
    if lay.attention == "fused" or lay.cp > 1:  # the lse counted as two 16-bit elements: float32, or wider
        rows = model.heads * lay.local_seq * lay.micro_batch / lay.tp
        extra += rows * (max(4, e) - 2 * e) / e  # a float64 run keeps it in float64, one element a row
    return {"paper": paper, "tpsim_extra": e * extra, "total": paper + e * extra}


def logits_bytes(model: ModelSpec, lay: Layout) -> int:
    """The loss's fp32 logits on the last stage for one micro-batch: b·s·Vp/t·4 (s/cp tokens a CP rank)."""
    return lay.micro_batch * lay.local_seq * padded_vocab_size(model.vocab, lay.tp) // lay.tp * 4


def activation_peaks(model: ModelSpec, lay: Layout, count: str = "paper") -> list[float]:
    """Each pipeline rank's peak layer activations (bytes): the schedule's pairs in flight, each weighing its
    virtual stage's layers × one layer's bytes (module docstring) — the paper's layer, or with ``count="total"``
    tpsim's own (the paper's + its norms' rstd), which a live rank holds (``tpsim.live_pipeline.in_flight``)."""
    layer = activation_bytes_per_layer(model, lay)[count]
    per = virtual_stage_layers(model, lay)
    weights = [[per[c * lay.pp + r] * layer for c in range(lay.vp)] for r in range(lay.pp)]
    return in_flight_peak(compiled(lay.schedule, lay.pp, lay.microbatches, lay.vp), weights)


def stage_memory(model: ModelSpec, lay: Layout, stage: int, peaks: list[float] | None = None) -> dict[str, float]:
    """Bytes on one GPU of ``stage``: params, grads, optimizer, activations (in flight + logits, and ZeRO-3's
    gathered pieces: ``zero3_gathered``, of them), total."""
    n = stage_param_elements(model, lay.tp, lay.pp, stage, rank_layers(model, lay)[stage])
    per = state_bytes_per_param(lay.dtype, lay.zero, lay.grad_replicas)  # ZeRO-1 shards over dp·cp
    acts = (activation_peaks(model, lay) if peaks is None else peaks)[stage] + ring_buffer_bytes(model, lay)
    if stage == lay.pp - 1:
        acts += logits_bytes(model, lay)
    p_bytes, g_bytes, _ = STATE_BYTES[lay.dtype]
    gathered = gathered_bytes(model, lay, stage, p_bytes, g_bytes)
    out = {"params": n * per["params"], "grads": n * per["grads"], "optimizer": n * per["optimizer"],
           "activations": acts + gathered}
    return {**out, "total": sum(out.values()), "param_count": n, "stage": stage, "zero3_gathered": gathered}


def ring_buffer_bytes(model: ModelSpec, lay: Layout) -> int:
    """``--cp-comm ring``'s two K/V receive buffers, one block each (the one attended to, the next arriving):
    2 × 2·b·g_t·(s/cp)·d·e bytes, live during one layer's attention, so counted once; 0 otherwise."""
    if lay.cp == 1 or lay.cp_comm != "ring":
        return 0
    block = 2 * lay.micro_batch * kv_heads_per_rank(model, lay.tp) * lay.local_seq * model.head_dim
    return 2 * block * ACT_BYTES[lay.dtype]


def busiest_stage(model: ModelSpec, lay: Layout) -> dict[str, float]:
    """The stage with the most bytes per GPU (the first of equals)."""
    peaks = activation_peaks(model, lay)
    return max((stage_memory(model, lay, s, peaks) for s in range(lay.pp)), key=lambda m: m["total"])
