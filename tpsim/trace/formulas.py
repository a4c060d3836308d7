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
nothing. This branch is written from Korthikanti et al. and aligned with ``tpsim.tp.sequence_parallel``;
tests/mpi/test_sequence_parallel.py and tests/mpi/test_formulas.py pin it against real traces.

A Llama (``LlamaConfig``, ``tpsim.models.llama``) issues the same collectives under its own names
(``LLAMA_NAMES``: model.embed_tokens, model.layers.i.self_attn / .mlp, model.norm; q/k/v and gate/up each
enter the TP region with one shared f), the untied LM head's f, an SP norm gradient of [h] (RMSNorm has no
bias), and one more: when tp > kv_heads each KV head is replicated on tp / kv_heads ranks and its
(dW_k, dW_v) = [2, h, head_dim] is all-reduced in the ``kv`` sub-group, once per layer, phase backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from tpsim.cost import wire_bytes
from tpsim.phases import BACKWARD, DATA, DP_SYNC, FORWARD, OPTIMIZER, SP_GRAD_SYNC, TRAINING
from tpsim.table import RULE, format_table
from tpsim.trace.aggregate import by_layer, summarize
from tpsim.trace.llama_memory import is_llama
from tpsim.trace.memory import param_elements


@dataclass(frozen=True)
class LayerNames:
    """Where a model's collectives are traced: the GPT-2 names, or Llama's (the same collectives otherwise)."""

    embed: str
    final_norm: str
    block: str  # prefix of block i: f"{block}.{i}"
    attn: str
    mlp: str
    norm_1: str  # before attention
    norm_2: str  # before the MLP


GPT_NAMES = LayerNames("transformer.wte", "transformer.ln_f", "transformer.h", "attn", "mlp", "ln_1", "ln_2")
LLAMA_NAMES = LayerNames("model.embed_tokens", "model.norm", "model.layers", "self_attn", "mlp", "input_layernorm",
                         "post_attention_layernorm")


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


class _Rows:
    """The predictions being built, keyed by (layer, phase, op, group) in the order the collectives are issued."""

    def __init__(self, tp: int, dp: int, kv: int = 1) -> None:
        self.sizes = {"tp": tp, "dp": dp, "kv": kv}
        self.rows: dict[tuple[str, str, str, str], Prediction] = {}

    def add(self, layer: str, phase: str, op: str, group: str, nbytes: int, calls: int = 1) -> None:
        """``calls`` collectives of ``nbytes`` logical bytes each (none at all when ``calls`` is 0)."""
        if calls == 0:
            return
        p = self.sizes[group]
        row = self.rows.setdefault((layer, phase, op, group), Prediction(layer, phase, op, group, p, 0, 0, 0))
        row.calls += calls
        row.bytes += nbytes * calls
        row.wire_bytes += wire_bytes(op, nbytes, p) * calls


def _forward(rows: _Rows, blocks: list[str], act: int, sequence_parallel: bool, n: LayerNames) -> None:
    """The model's forward up to the logits: g per block under TP, the pair f̄ then ḡ under SP."""
    rows.add(n.embed, FORWARD, "all_reduce", "tp", act)  # under SP too: then the sequence is split
    for blk in blocks:
        for part in (n.attn, n.mlp):
            if sequence_parallel:  # f̄ gathers the sequence in, ḡ reduce-scatters the result out
                rows.add(f"{blk}.{part}", FORWARD, "all_gather", "tp", act)
                rows.add(f"{blk}.{part}", FORWARD, "reduce_scatter", "tp", act)
            else:  # g
                rows.add(f"{blk}.{part}", FORWARD, "all_reduce", "tp", act)
    if sequence_parallel:
        rows.add("lm_head", FORWARD, "all_gather", "tp", act)


def _loss(rows: _Rows, row_bytes: int, dp: int, label_smoothing: bool) -> None:
    """The vocab-parallel cross-entropy's three all-reduces of ``row_bytes`` (b·s elements), the DP normaliser."""
    rows.add("loss", FORWARD, "all_reduce", "tp", row_bytes, calls=2)  # max, Σexp
    rows.add("loss", FORWARD, "all_reduce", "tp", (2 if label_smoothing else 1) * row_bytes)  # target (, Σz)
    if dp > 1:
        rows.add("loss_normalizer", DP_SYNC, "all_reduce", "dp", 2 * 8)


def _tp_backward(rows: _Rows, blocks: list[str], act: int, n: LayerNames) -> None:
    """f of the tied head, then of c_fc and c_attn in every block, last block first."""
    rows.add("lm_head", BACKWARD, "all_reduce", "tp", act)
    for blk in reversed(blocks):
        rows.add(f"{blk}.{n.mlp}", BACKWARD, "all_reduce", "tp", act)
        rows.add(f"{blk}.{n.attn}", BACKWARD, "all_reduce", "tp", act)


def _sp_backward(rows: _Rows, blocks: list[str], act: int, ln_grads: int, regather: int, n: LayerNames) -> None:
    """SP's backward: the conjugates of f̄ and ḡ, ``regather`` re-gathers per column-parallel linear, and
    each LayerNorm's (dw, db) all-reduced as one ``ln_grads``-byte message in phase ``SP_GRAD_SYNC``."""
    rows.add("lm_head", BACKWARD, "all_gather", "tp", act, calls=regather)
    rows.add("lm_head", BACKWARD, "reduce_scatter", "tp", act)
    rows.add(n.final_norm, SP_GRAD_SYNC, "all_reduce", "tp", ln_grads)
    for blk in reversed(blocks):
        for part, ln in ((n.mlp, n.norm_2), (n.attn, n.norm_1)):  # ḡ's all-gather, the re-gather, f̄'s scatter
            rows.add(f"{blk}.{part}", BACKWARD, "all_gather", "tp", act, calls=1 + regather)
            rows.add(f"{blk}.{part}", BACKWARD, "reduce_scatter", "tp", act)
            rows.add(f"{blk}.{ln}", SP_GRAD_SYNC, "all_reduce", "tp", ln_grads)
    rows.add(n.embed, BACKWARD, "all_gather", "tp", act)  # the sequence split's backward


def _check_sizes(config, tp: int, dp: int, batch_size: int, seq_len: int, sequence_parallel: bool) -> None:
    config.check(tp)
    if batch_size % dp:
        raise ValueError(f"global batch {batch_size} is not divisible by dp {dp}")
    if sequence_parallel and seq_len % tp:
        raise ValueError(f"sequence length {seq_len} is not divisible by tp {tp} (sequence parallelism)")


def predict_step(config, tp: int, dp: int, batch_size: int, seq_len: int, dtype, *, clip: bool,
                 grad_bytes_local: int | None = None, sequence_parallel: bool = False,
                 ddp_buckets: int | None = None, label_smoothing: bool = False,
                 sp_regather_in_backward: bool = True) -> list[Prediction]:
    """Every collective one rank issues in one training step (see the module docstring), in issue order.

    ``config``: a ``GPTConfig`` or a ``LlamaConfig``; ``batch_size``: the *global* batch (each DP rank takes batch_size / dp rows);
    ``dtype``: the model's dtype (activations, gradients) or its size in bytes. ``grad_bytes_local``: the DDP
    bytes; default every parameter's local shard at this tp (vocabulary padded, tied head once).
    ``ddp_buckets``: ``len(GradSync.buckets)``, the DDP call count; None leaves it unpredicted.
    """
    _check_sizes(config, tp, dp, batch_size, seq_len, sequence_parallel)
    llama = is_llama(config)
    n = LLAMA_NAMES if llama else GPT_NAMES
    h = config.hidden_size if llama else config.n_embd
    e, b, s = _itemsize(dtype), batch_size // dp, seq_len
    act = b * s * h * e  # one [b, s, h] activation
    blocks = [f"{n.block}.{i}" for i in range((config.num_hidden_layers if llama else config.n_layer))]
    kv_rep = tp // config.num_key_value_heads if llama and tp > config.num_key_value_heads else 1
    rows = _Rows(tp, dp, kv_rep)
    if tp > 1:
        rows.add("batch", DATA, "broadcast", "tp", 2 * b * s * 8)  # int64 [2, b, s]: ids and labels
    _forward(rows, blocks, act, sequence_parallel, n)
    _loss(rows, b * s * e, dp, label_smoothing)
    if sequence_parallel:  # a LayerNorm's (dw, db) is [2, h]; an RMSNorm has dw alone
        _sp_backward(rows, blocks, act, ln_grads=(1 if llama else 2) * h * e,
                     regather=1 if sp_regather_in_backward else 0, n=n)
    else:
        _tp_backward(rows, blocks, act, n)
    if kv_rep > 1:  # replicated KV heads: (dW_k, dW_v) summed over the tp / kv ranks sharing one
        for blk in reversed(blocks):
            rows.add(f"{blk}.{n.attn}", BACKWARD, "all_reduce", "kv", 2 * h * config.head_dim * e)
    if dp > 1:
        total = param_elements(config, tp) * e if grad_bytes_local is None else grad_bytes_local
        rows.rows[("ddp", DP_SYNC, "all_reduce", "dp")] = Prediction(
            "ddp", DP_SYNC, "all_reduce", "dp", dp, ddp_buckets, total, wire_bytes("all_reduce", total, dp))
    if clip:
        rows.add("clip_grad_norm", OPTIMIZER, "all_reduce", "tp", 8)
    return list(rows.rows.values())


# --- measured vs predicted -------------------------------------------------------------------------------------


@dataclass
class Row:
    """One (layer, phase, op, group): measured per-rank averages beside the prediction; None where absent."""

    layer: str
    phase: str
    op: str
    group: str
    measured_calls: float | None = None
    predicted_calls: int | None = None
    measured_bytes: float | None = None
    predicted_bytes: int | None = None
    measured_wire: float | None = None
    predicted_wire: int | None = None
    match: bool = field(default=False)


def compare(measured_records: Iterable[dict], predictions: Sequence[Prediction],
            phases: Sequence[str] | None = TRAINING) -> list[Row]:
    """Measured records of *one* step (dicts as in ``comm.jsonl``, one rank or many) against ``predictions``.

    Records are grouped by (layer_of(scope), phase, op, group) and averaged per rank; records outside
    ``phases`` (init, verify, trace, ...) are left out. A row matches when both sides exist, the calls are
    equal (or not predicted) and the bytes are exactly equal. Rows come in prediction order, then any
    measured row nobody predicted.
    """
    records = list(measured_records)
    ranks = max(1, len({r["rank"] for r in records}))
    kept = [r for r in by_layer(records) if phases is None or r["phase"] in phases]
    measured = {row.key: row for row in summarize(kept, keys=("scope", "phase", "op", "group"), ranks=ranks)}
    out = []
    for p in predictions:
        m = measured.pop(p.key, None)
        row = Row(*p.key, predicted_calls=p.calls, predicted_bytes=p.bytes, predicted_wire=p.wire_bytes)
        if m is not None:
            row.measured_calls, row.measured_bytes, row.measured_wire = m.calls, m.bytes, m.wire_bytes
            row.match = (p.calls is None or m.calls == p.calls) and m.bytes == p.bytes
        out.append(row)
    for key, m in measured.items():
        out.append(Row(*key, measured_calls=m.calls, measured_bytes=m.bytes, measured_wire=m.wire_bytes))
    return out


def _num(x) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.2f}"


def format_comparison(rows: Sequence[Row], title: str = "") -> str:
    """A fixed-width table: calls, logical bytes and wire bytes, measured | predicted, and a match mark."""

    headers = ["layer", "phase", "op", "group", "calls", "pred", "bytes", "pred bytes", "wire", "pred wire", "ok"]
    body = [[r.layer, r.phase, r.op, r.group, _num(r.measured_calls),
             "any" if r.predicted_calls is None and r.predicted_bytes is not None else _num(r.predicted_calls),
             _num(r.measured_bytes), _num(r.predicted_bytes), _num(r.measured_wire), _num(r.predicted_wire),
             "yes" if r.match else "NO"] for r in rows]
    return format_table([headers, RULE, *body], right=range(4, 10), title=title)


def formula_verdict(rows: Sequence[Row]) -> tuple[bool, str]:
    """``(ok, loud line)``: ``FORMULA CHECK: all N rows match`` or ``FORMULA CHECK FAILED: ...`` naming rows."""
    bad = [r for r in rows if not r.match]
    if rows and not bad:
        return True, f"FORMULA CHECK: all {len(rows)} rows match (calls and bytes per rank, exactly)"
    what = "; ".join(f"{r.layer}/{r.phase}/{r.op}/{r.group}: calls {_num(r.measured_calls)} vs "
                     f"{_num(r.predicted_calls)}, bytes {_num(r.measured_bytes)} vs {_num(r.predicted_bytes)}"
                     for r in bad[:5])
    more = f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
    return False, f"FORMULA CHECK FAILED: {len(bad)} of {len(rows)} rows differ (measured vs predicted): {what}{more}"
