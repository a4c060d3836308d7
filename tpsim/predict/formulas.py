"""Megatron-LM's communication volumes as predictions, and a check of a measured trace against them.

Megatron-LM (Shoeybi et al., 2019, §3) puts exactly two all-reduces in the forward and two in the backward of
every transformer block (g after attention's and the MLP's row-parallel linear; f before their column-parallel
linear), each of the whole activation, b·s·h elements (b = rows per DP rank). Around the blocks, tpsim adds:

    layer (layer_of)      phase      op          group  per step
    batch                 data       broadcast   tp     int64 [2, b, s] (ids and labels), only when tp > 1
    transformer.wte       forward    all_reduce  tp     b·s·h        (vocab-parallel embedding, g)
    transformer.h.i.attn  fwd / bwd  all_reduce  tp     b·s·h each   (g in c_proj / f in c_attn)
    transformer.h.i.mlp   fwd / bwd  all_reduce  tp     b·s·h each   (g in c_proj / f in c_fc)
    loss                  forward    all_reduce  tp     3 × b·s      (max, Σexp, target logit; label smoothing
                                                                      packs the last as [2, b·s])
    loss_normalizer       dp_sync    all_reduce  dp     float64 [2], only when dp > 1
    lm_head               backward   all_reduce  tp     b·s·h        (f of the tied head)
    ddp                   dp_sync    all_reduce  dp     every local gradient byte, in however many buckets
    clip_grad_norm        optimizer  all_reduce  tp     float64 [1], when clipping
    loss_scaler           optimizer  all_reduce  world  float64 [1] found-inf flag, float16 loss scaling only

Context parallelism (``cp > 1``, ``tpsim.cp``): every row above is a CP rank's, on its s/cp tokens (b·(s/cp)·h
activations); the "dp" group is DP × CP (dp·cp ranks average the gradients, the loss normaliser sums over them);
and every attention layer adds its CP messages in group "cp", forward and backward (``tpsim.predict.cp_comm``:
ring send/recv, all-gather/reduce-scatter, or Ulysses' all-to-alls).

Mixed precision (a bfloat16/float16 ``dtype``, ``tpsim.nn.precision``): activations and the TP collectives
that carry them are 2 bytes per element; what is accumulated in float32 — the main gradients (DDP, the
sequence-parallel LayerNorm gradients) and the cross-entropy's reductions over the vocabulary (logits cast
up, as Megatron's ``logits.float()``) — is 4 bytes; the scalar reductions stay float64.

ZeRO-1 (``zero=1``, ``tpsim.train.zero``) replaces the ``ddp`` row by two and moves the clip norm to the world:

    zero                  dp_sync    reduce_scatter dp  every padded gradient-bucket byte    (p−1)/p of it sent
    clip_grad_norm        optimizer  all_reduce  world  float64 [1], when clipping (the owned slices' Σg²)
    zero                  optimizer  all_gather  dp     the same bytes, parameters this time (p−1)/p sent

so reduce-scatter + all-gather send 2(p−1)/p of the buffer, the all-reduce's wire bytes exactly (the buckets
are padded to a multiple of dp, so no rounding creeps in). Under mixed precision the two are no longer equal:
the reduce-scatter carries the float32 main gradients (4 bytes per element), the all-gather the 16-bit
parameters (2 bytes per element, traced as bfloat16/float16), so ZeRO-1 sends 3/4 of the float32 all-reduce's
wire bytes; float16 adds the ``loss_scaler`` row as without ZeRO.

ZeRO-2 and ZeRO-3 (``zero=2|3``): ``tpsim.predict.zero_rows`` — ZeRO-2 the same rows at one micro-batch, ZeRO-3
the reduce-scatter and every unit's all-gather before its forward and before its backward (phases forward and
backward), none after the step.

TP collectives are issued (and traced, with zero wire bytes) even at tp = 1; DP ones are skipped at dp = 1.

Sequence parallelism (Korthikanti et al., 2022, §4.2.2; ``sequence_parallel=True``). Each all-reduce of a
block becomes a reduce-scatter plus an all-gather along the sequence: forward, the all-gather f̄ before each
column-parallel linear and the reduce-scatter ḡ after each row-parallel one; backward, their conjugates. Every
one moves the full logical tensor b·s·h, the all-reduce's bytes, and the pair sends what the all-reduce sent
((p−1)/p twice = 2(p−1)/p once). ``sp_regather_in_backward`` (default True, as in Megatron-LM and tpsim): a
column-parallel linear keeps only its sequence shard and all-gathers it again in backward for its weight
gradient — one more all-gather per column-parallel linear and for the LM head. Outside the blocks, as in
Megatron-LM for learned positions: the embedding all-reduces as before and then only splits the sequence (its
backward all-gathers), the LM head all-gathers ln_f's shard (backward: reduce-scatter), the loss is unchanged.
Each LayerNorm's weight and bias gradients, now partial sums over sequence shards, are all-reduced as one
[2, h] message, traced under the LayerNorm's own scope in phase ``sp_grad_sync`` (``tpsim.phases``); the
row-parallel biases and the position embedding get complete gradients from all-gathered tensors and need
nothing. ``--tp-comm-overlap`` (``tpsim.tp.collective_matmul``) moves the f̄ / ḡ collectives beside a GEMM — both
forward, ḡ's backward all-gather and f̄'s backward reduce-scatter, the LM head's two alike; not the re-gathers,
not the embedding's — in t − 1 steps, each recorded with the chunk of b·s·h/t elements it sent: t − 1 calls of
1/t of the bytes, the same wire bytes. This branch is written from Korthikanti et al. and aligned with ``tpsim.tp.sequence_parallel``;
tests/mpi/test_sequence_parallel.py and tests/mpi/test_traced_formulas.py pin it against real traces.

A Llama (``LlamaConfig``, ``tpsim.models.llama``) issues the same collectives under its own names
(``config.layer_names``: model.embed_tokens, model.layers.i.self_attn / .mlp, model.norm; q/k/v and gate/up each
enter the TP region with one shared f), the untied LM head's f, an SP norm gradient of [h] (RMSNorm has no
bias), and one more: when tp > kv_heads each KV head is replicated on tp / kv_heads ranks and its
(dW_k, dW_v) = [2, h, head_dim] is all-reduced in the ``kv`` sub-group, once per layer, phase backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpsim.cost import wire_bytes
from tpsim.predict.cp_comm import cp_messages
from tpsim.nn.precision import accum_itemsize
from tpsim.phases import BACKWARD, DATA, DP_SYNC, FORWARD, OPTIMIZER, SP_GRAD_SYNC
from tpsim.arch.shape import LayerNames, kv_heads_per_rank, kv_replicas
from tpsim.predict.memory import param_elements
from tpsim.partition import padded_length
from tpsim.predict.zero_rows import zero_gathers


@dataclass
class Prediction:
    """Collectives one rank issues in one training step for one (layer, phase, op, group).

    ``calls`` None means "not predicted" (the DDP bucket count, when the caller does not give it).
    ``bytes``: logical bytes summed over the calls; ``wire_bytes``: what the rank sends under the ring.
    """

    layer: str
    phase: str
    op: str
    group: str
    group_size: int
    calls: int | None
    bytes: int
    wire_bytes: int

    @property
    def key(self) -> tuple[str, str, str, str]:
        return self.layer, self.phase, self.op, self.group


def _itemsize(dtype) -> int:
    """Bytes per element: an int is taken as is (e.g. 2 for bf16, which NumPy lacks), else ``np.dtype``."""
    return dtype if isinstance(dtype, int) else np.dtype(dtype).itemsize


class PredictionRows:
    """The predictions being built, keyed by (layer, phase, op, group) in the order the collectives are issued.
    ``repeat``: every call added is issued that many times (a pipeline's micro-batches); ``pp``: the pipeline."""

    def __init__(self, tp: int, dp: int, kv: int = 1, *, pp: int = 1, repeat: int = 1, cp: int = 1,
                 mlp_copies: dict[str, int] | None = None) -> None:
        self.mlp_copies = mlp_copies or {}  # block -> its TP-parallel MLPs (a MoE layer: its shared experts)
        self.sizes = {"tp": tp, "dp": dp * cp, "kv": kv, "world": tp * dp * cp * pp, "pp": pp, "embedding": 2,
                      "mp": tp * pp, "cp": cp}  # "dp": the gradient group, DP x CP
        self.repeat = repeat
        self.rows: dict[tuple[str, str, str, str], Prediction] = {}

    def add_sp(self, layer: str, phase: str, op: str, nbytes: int, overlap: bool) -> None:
        """An SP all-gather / reduce-scatter of ``nbytes`` over tp: one call, or under ``--tp-comm-overlap`` its
        t − 1 steps (``tpsim.tp.collective_matmul``), each a chunk of nbytes / t sent: the same wire bytes."""
        if not overlap:
            self.add(layer, phase, op, "tp", nbytes)
            return
        t, steps = self.sizes["tp"], (self.sizes["tp"] - 1) * self.repeat
        row = self.rows.setdefault((layer, phase, op, "tp"), Prediction(layer, phase, op, "tp", t, 0, 0, 0))
        row.calls += steps
        row.bytes += nbytes // t * steps
        row.wire_bytes += nbytes // t * steps

    def add(self, layer: str, phase: str, op: str, group: str, nbytes: int, calls: int = 1) -> None:
        """``calls`` collectives of ``nbytes`` logical bytes each (none at all when ``calls`` is 0)."""
        calls *= self.repeat
        if calls == 0:
            return
        p = self.sizes[group]
        row = self.rows.setdefault((layer, phase, op, group), Prediction(layer, phase, op, group, p, 0, 0, 0))
        row.calls += calls
        row.bytes += nbytes * calls
        row.wire_bytes += wire_bytes(op, nbytes, p) * calls


def _forward(rows: PredictionRows, blocks: list[str], act: int, sequence_parallel: bool, n: LayerNames,
             first: bool = True, last: bool = True, overlap: bool = False) -> None:
    """The model's forward up to the logits: g per block under TP, the pair f̄ then ḡ under SP; ``first`` /
    ``last``: this (pipeline stage) holds the embedding / the LM head."""
    if first:
        rows.add(n.embed, FORWARD, "all_reduce", "tp", act)  # under SP too: then the sequence is split
    for blk in blocks:
        for part in (n.attn, *[n.mlp] * rows.mlp_copies.get(blk, 1)):
            if sequence_parallel:  # f̄ gathers the sequence in, ḡ reduce-scatters the result out
                rows.add_sp(f"{blk}.{part}", FORWARD, "all_gather", act, overlap)
                rows.add_sp(f"{blk}.{part}", FORWARD, "reduce_scatter", act, overlap)
            else:  # g
                rows.add(f"{blk}.{part}", FORWARD, "all_reduce", "tp", act)
    if sequence_parallel and last:
        rows.add_sp("lm_head", FORWARD, "all_gather", act, overlap)


def _loss(rows: PredictionRows, row_bytes: int, normalizer: bool, label_smoothing: bool) -> None:
    """The vocab-parallel cross-entropy's three all-reduces of ``row_bytes`` (b·s elements), the DP normaliser."""
    rows.add("loss", FORWARD, "all_reduce", "tp", row_bytes, calls=2)  # max, Σexp
    rows.add("loss", FORWARD, "all_reduce", "tp", (2 if label_smoothing else 1) * row_bytes)  # target (, Σz)
    if normalizer:
        rows.add("loss_normalizer", DP_SYNC, "all_reduce", "dp", 2 * 8)


def _tp_backward(rows: PredictionRows, blocks: list[str], act: int, n: LayerNames, last: bool = True) -> None:
    """f of the tied head, then of c_fc and c_attn in every block, last block first."""
    if last:
        rows.add("lm_head", BACKWARD, "all_reduce", "tp", act)
    for blk in reversed(blocks):
        rows.add(f"{blk}.{n.mlp}", BACKWARD, "all_reduce", "tp", act, calls=rows.mlp_copies.get(blk, 1))
        rows.add(f"{blk}.{n.attn}", BACKWARD, "all_reduce", "tp", act)


def _sp_backward(rows: PredictionRows, blocks: list[str], act: int, ln_grads: int, regather: int, n: LayerNames,
                 first: bool = True, last: bool = True, overlap: bool = False) -> None:
    """SP's backward: the conjugates of f̄ and ḡ, ``regather`` re-gathers per column-parallel linear, and
    each LayerNorm's (dw, db) all-reduced as one ``ln_grads``-byte message in phase ``SP_GRAD_SYNC``."""
    if last:
        rows.add("lm_head", BACKWARD, "all_gather", "tp", act, calls=regather)
        rows.add_sp("lm_head", BACKWARD, "reduce_scatter", act, overlap)
        rows.add(n.final_norm, SP_GRAD_SYNC, "all_reduce", "tp", ln_grads)
    for blk in reversed(blocks):
        parts = [(n.mlp, None)] * rows.mlp_copies.get(blk, 1) + [(None, n.norm_2), (n.attn, n.norm_1)]
        for part, ln in parts:  # ḡ's all-gather, the re-gather, f̄'s scatter; then the norm's sync
            if part is None:
                rows.add(f"{blk}.{ln}", SP_GRAD_SYNC, "all_reduce", "tp", ln_grads)
                continue
            if overlap:  # ḡ's all-gather pipelined with dz·Bᵀ; the re-gather stays whole (dW sums over its rows)
                rows.add_sp(f"{blk}.{part}", BACKWARD, "all_gather", act, overlap)
                rows.add(f"{blk}.{part}", BACKWARD, "all_gather", "tp", act, calls=regather)
            else:
                rows.add(f"{blk}.{part}", BACKWARD, "all_gather", "tp", act, calls=1 + regather)
            rows.add_sp(f"{blk}.{part}", BACKWARD, "reduce_scatter", act, overlap)
            if ln is not None:
                rows.add(f"{blk}.{ln}", SP_GRAD_SYNC, "all_reduce", "tp", ln_grads)
    if first:
        rows.add(n.embed, BACKWARD, "all_gather", "tp", act)  # the sequence split's backward


def model_rows(rows: PredictionRows, config, tp: int, sp: bool, blocks: list[str], *, b: int, s: int, e: int, acc: int,
               first: bool = True, last: bool = True, normalizer: bool = False, label_smoothing: bool = False,
               sp_regather_in_backward: bool = True, overlap: bool = False, cp_comm: str = "ring") -> None:
    """The collectives of one forward and backward of ``blocks`` on ``b`` rows of ``s`` tokens (``e`` bytes an
    activation element, ``acc`` an accumulated one); ``first`` / ``last``: the embedding / the head and loss are
    here too (a whole model: both). ``normalizer``: the DP loss normaliser follows the loss (dp > 1, no pipeline).
    Under context parallelism (``rows`` made with cp > 1) ``s`` is a CP rank's s/cp tokens and every attention
    layer adds its CP messages (``tpsim.predict.cp_comm``, by ``cp_comm``)."""
    n, h = config.layer_names, config.hidden
    act = b * s * h * e  # one [b, s, h] activation
    _forward(rows, blocks, act, sp, n, first, last, overlap)
    if last:
        _loss(rows, b * s * acc, normalizer, label_smoothing)
    if sp:  # a LayerNorm's (dw, db) is [2, h]; an RMSNorm has dw alone
        _sp_backward(rows, blocks, act, ln_grads=config.norm_params * h * acc,
                     regather=1 if sp_regather_in_backward else 0, n=n, first=first, last=last, overlap=overlap)
    else:
        _tp_backward(rows, blocks, act, n, last)
    if kv_replicas(config, tp) > 1:  # replicated KV heads: (dW_k, dW_v) summed over the tp / kv ranks sharing one
        for blk in reversed(blocks):
            rows.add(f"{blk}.{n.attn}", BACKWARD, "all_reduce", "kv", 2 * h * config.head_dim * acc)
    cp = rows.sizes["cp"]
    for blk in blocks if cp > 1 else ():  # context parallelism: attention's messages over the CP group
        sizes = dict(b=b, s=s * cp, heads=config.heads // tp, kv_heads=kv_heads_per_rank(config, tp),
                     head_dim=config.head_dim, e=e)
        for phase, op, calls, nbytes in cp_messages(cp_comm, cp, **sizes):
            rows.add(f"{blk}.{n.attn}", phase, op, "cp", nbytes, calls)


def predict_step(run, *, clip: bool, update: bool = True, grad_bytes_local: int | None = None,
                 ddp_buckets: int | None = None, label_smoothing: bool = False, sp_regather_in_backward: bool = True,
                 itemsize: int | None = None) -> list[Prediction]:
    """Every collective one rank issues in one training step of ``run`` (a ``tpsim.config.RunConfig``: the
    model, tp, dp, sp, zero, the dtype, the *global* batch and the sequence length), in issue order (see the
    module docstring). Each DP rank takes batch_size / dp rows.

    ``clip``: the step measures the global gradient norm (clipping, or the demo's non-finite guard): one
    float64 all-reduce. ``update``: the step ends in an optimizer update (float16's found-inf all-reduce is
    part of it). ``grad_bytes_local``: the DDP bytes; default every parameter's local shard at this tp
    (vocabulary padded, tied head once). ``ddp_buckets``: ``len(GradSync.buckets)``, the DDP call count; None
    leaves it unpredicted. Under ZeRO-1 (``run.parallel.zero == 1``) the reduce-scatter + all-gather replace
    the DDP all-reduce (``grad_bytes_local`` then means the padded buckets' bytes,
    ``DistributedOptimizer.total_bytes``; ``ddp_buckets`` their count); the all-gather moves the same elements
    in the parameters' dtype (2 bytes each under mixed precision). A bfloat16/float16 dtype: mixed precision,
    float32 accumulations (module docstring). ``itemsize``: every tensor that many bytes instead, whatever the
    dtype (the planner's and the what-if figure's convention for real-size layouts).
    """
    config, par, sch = run.model, run.parallel, run.schedule
    tp, dp, sequence_parallel, zero = par.tp, par.dp, par.sp, par.zero_stage
    batch_size, seq_len = sch.batch_size, sch.seq_len
    dtype = run.precision.numpy if itemsize is None else itemsize
    loss_scaling = update and run.precision.loss_scaling
    if par.pp > 1:
        raise ValueError("a pipeline's step: tpsim.predict.pipeline_comm.predict_pipeline_step")
    n = config.layer_names
    e, b, s = _itemsize(dtype), batch_size // dp, seq_len // par.cp  # s: a CP rank's tokens
    acc = e if isinstance(dtype, int) else accum_itemsize(dtype)  # float32 accumulations under 16-bit dtypes
    blocks = [f"{n.block}.{i}" for i in range(config.layers)]
    rows = PredictionRows(tp, dp, kv_replicas(config, tp), cp=par.cp)  # kv: 1 unless KV heads are replicated (tp > kv)
    dp = par.grad_replicas  # from here on the gradient group: DP x CP
    if tp > 1:
        rows.add("batch", DATA, "broadcast", "tp", 2 * b * s * 8)  # int64 [2, b, s]: ids and labels
    model_rows(rows, config, tp, sequence_parallel, blocks, b=b, s=s, e=e, acc=acc, normalizer=dp > 1,
               label_smoothing=label_smoothing, sp_regather_in_backward=sp_regather_in_backward,
               overlap=par.tp_comm_overlap, cp_comm=par.cp_comm)
    elements = param_elements(config, tp)
    if zero.shards_optimizer:  # one bucket padded to a multiple of dp, unless the caller gives the padded bytes
        total = padded_length(elements, dp) * acc if grad_bytes_local is None else grad_bytes_local
        if dp > 1:
            add_bucketed(rows, "zero", DP_SYNC, "reduce_scatter", total, ddp_buckets)
    elif dp > 1:
        total = elements * acc if grad_bytes_local is None else grad_bytes_local
        add_bucketed(rows, "ddp", DP_SYNC, "all_reduce", total, ddp_buckets)
    if loss_scaling:
        rows.add("loss_scaler", OPTIMIZER, "all_reduce", "world", 8)
    if clip:  # ZeRO-1's norm sums the owned slices over the whole world
        rows.add("clip_grad_norm", OPTIMIZER, "all_reduce", "world" if zero.shards_optimizer else "tp", 8)
    if zero.shards_optimizer and dp > 1:  # the parameters' all-gathers: after the step, or (ZeRO-3) around units
        for phase, n, calls in zero_gathers(config, zero.stage, total // acc * e, ddp_buckets, tp=tp, dp=dp, e=e):
            add_bucketed(rows, "zero", phase, "all_gather", n, calls)
    return list(rows.rows.values())


def add_bucketed(rows: PredictionRows, layer: str, phase: str, op: str, total: int, buckets: int | None) -> None:
    """A DP collective over ``total`` bytes in ``buckets`` calls (None: the count is not predicted)."""
    dp = rows.sizes["dp"]
    rows.rows[(layer, phase, op, "dp")] = Prediction(layer, phase, op, "dp", dp, buckets, total,
                                                     wire_bytes(op, total, dp))
