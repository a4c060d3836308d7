"""Causal multi-head self-attention, GPT-2 layout — the per-head core, and the layer written once for serial and TP.

    x [b, s, h] --c_attn--> qkv [b, s, 3h] = q | k | v        (head j of q = columns j·hd:(j+1)·hd, as HF GPT-2)
      q, k, v -> [b, nh, s, hd]
      scores = q·kᵀ / √hd  [b, nh, s, s],  future keys (j > i) set to −∞     causal mask
      probs  = softmax(scores) along keys, then attention dropout (mask supplied by a dropout RNG tracker)
      ctx    = probs·v  [b, nh, s, hd]  -> merge heads -> [b, s, h] --c_proj--> y [b, s, h]

Every head is independent of the others from q·kᵀ to probs·v. That is why Megatron's ParallelAttention
splits attention *by heads*: a rank holding the q, k and v columns of whole heads runs this same core on them
with no communication (``tpsim.tp.attention``). The core functions below therefore take any number of heads,
and ``MultiHeadAttention`` runs them on the heads its ``c_attn`` holds: all of them (``CausalSelfAttention``)
or a rank's share (``ParallelSelfAttention``), the same forward and backward.

Backward of the core, with P the (dropped) probabilities and D = dropout's scaled mask:

    dv = Pᵀ·dctx      dP = dctx·vᵀ      dprobs = D ⊙ dP      dscores = softmax_backward(dprobs) / √hd
    dq = dscores·k    dk = dscoresᵀ·q

Masked (future) scores get −∞, so their probability is exactly 0 and so is their gradient; the diagonal is
never masked, so every row has a finite max and the softmax never sees an all −∞ row (no NaN).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.kinds import ELEMENTWISE_MARK, MATMUL_MARK
from tpsim.nn.dropout import DropoutPlan, dropout_mask_apply
from tpsim.nn.linear import Linear, LinearCache
from tpsim.nn.module import Module
from tpsim.nn.precision import matmul
from tpsim.nn.softmax import SoftmaxCache, softmax_backward, softmax_forward


# --- head layout ------------------------------------------------------------------------------------------------
def split_heads(x: np.ndarray, heads: int) -> np.ndarray:
    """``[b, s, heads·hd]`` -> ``[b, heads, s, hd]``; its backward is ``merge_heads``."""
    b, s, width = x.shape
    return x.reshape(b, s, heads, width // heads).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """``[b, heads, s, hd]`` -> ``[b, s, heads·hd]``; its backward is ``split_heads``."""
    b, heads, s, hd = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, heads * hd)


# --- the dropout mask of the attention probabilities ------------------------------------------------------------
def attention_keep_mask(plan: DropoutPlan, p: float, key: str, batch: int, heads: int, seq: int,
                        head_index=None, q_index=None, k_index=None) -> np.ndarray | None:
    """Keep mask ``bool [batch, len(head_index), len(q_index), len(k_index)]`` for the probabilities, or None (no
    dropout).

    ``head_index``: the global heads held here (default all); ``plan.batch_index``: the global batch rows;
    ``q_index``, ``k_index``: the absolute query and key positions (default all ``seq``: a context-parallel
    block names its own). The request names global positions, so an exact tracker gives a head-sharded, DP or
    CP rank the serial model's bits.
    """
    if p == 0.0 or plan.rng is None:
        return None
    rows = plan.rows(batch)
    # Only the global batch extent is unknown here; as the outermost dimension it never enters a flat index.
    global_shape = (int(rows.max()) + 1 if batch else 0, heads, seq, seq)
    every = slice(None)
    return plan.rng.keep_mask(p, key=key, step=plan.step, global_shape=global_shape,
                              index=(rows, every if head_index is None else head_index,
                                     every if q_index is None else q_index, every if k_index is None else k_index),
                              region="partitioned")


# --- the core: attention over some heads ------------------------------------------------------------------------
class AttentionCoreCache(NamedTuple):
    q: np.ndarray  # [b, nh, s, hd]
    k: np.ndarray  # [b, nh, s, hd]
    v: np.ndarray  # [b, nh, s, hd]
    softmax: SoftmaxCache  # the probabilities [b, nh, s, s] before dropout
    dropped: np.ndarray  # [b, nh, s, s] after dropout (the probabilities themselves when there is none)
    keep: np.ndarray | None  # bool [b, nh, s, s] or None
    p: float
    scale: float  # 1 / √hd


def attention_core_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray | None = None,
                           p: float = 0.0) -> tuple[np.ndarray, AttentionCoreCache]:
    """``q, k, v: [b, nh, s, hd]``, ``keep: bool [b, nh, s, s]`` or None -> ``(ctx [b, nh, s, hd], cache)``."""
    s, hd = q.shape[-2], q.shape[-1]
    scale = 1.0 / float(np.sqrt(hd))  # a Python float: a NumPy float64 scalar would promote float32 to float64
    future = np.triu(np.ones((s, s), dtype=bool), k=1)  # key j > query i: not yet seen
    with MATMUL_MARK:
        scores = matmul(q, k.swapaxes(-1, -2))
    with ELEMENTWISE_MARK:  # scaled and masked in place
        scores *= scale
        np.copyto(scores, -np.inf, where=future)
    probs, softmax = softmax_forward(scores, axis=-1)  # exp(−∞ − max) = 0 exactly: future keys get no weight
    dropped = probs if keep is None else dropout_mask_apply(probs, keep, p)
    with MATMUL_MARK:
        ctx = matmul(dropped, v)
    return ctx, AttentionCoreCache(q, k, v, softmax, dropped, keep, p, scale)


def attention_core_backward(dctx: np.ndarray, cache: AttentionCoreCache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``dctx: [b, nh, s, hd]`` -> ``(dq, dk, dv)``, each ``[b, nh, s, hd]``."""
    q, k, v, softmax, dropped, keep, p, scale = cache
    with MATMUL_MARK:
        dv = matmul(dropped.swapaxes(-1, -2), dctx)
        dprobs = matmul(dctx, v.swapaxes(-1, -2))
    if keep is not None:
        dprobs = dropout_mask_apply(dprobs, keep, p)  # dropout's backward: the same mask, the same scale
    dscores = softmax_backward(dprobs, softmax)  # zero where probs is zero: the masked keys
    with ELEMENTWISE_MARK:
        dscores *= scale
    with MATMUL_MARK:
        return matmul(dscores, k), matmul(dscores.swapaxes(-1, -2), q), dv


def qkv_attention_forward(qkv: np.ndarray, heads: int, keep: np.ndarray | None = None,
                          p: float = 0.0) -> tuple[np.ndarray, AttentionCoreCache]:
    """``qkv: [b, s, 3·heads·hd]`` laid out q | k | v -> ``(ctx [b, s, heads·hd], cache)``."""
    q, k, v = (split_heads(t, heads) for t in np.split(qkv, 3, axis=-1))
    ctx, cache = attention_core_forward(q, k, v, keep, p)
    return merge_heads(ctx), cache


def qkv_attention_backward(dctx: np.ndarray, cache: AttentionCoreCache) -> np.ndarray:
    """``dctx: [b, s, heads·hd]`` -> ``dqkv: [b, s, 3·heads·hd]`` (q | k | v again)."""
    dq, dk, dv = attention_core_backward(split_heads(dctx, cache.q.shape[1]), cache)
    return np.concatenate([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=-1)


class AttentionCache(NamedTuple):
    """The cache of ``MultiHeadAttention`` (serial or parallel)."""

    c_attn: LinearCache
    core: AttentionCoreCache
    c_proj: LinearCache


# --- the layer, written once -------------------------------------------------------------------------------------
class MultiHeadAttention(Module):
    """GPT-2 attention from its two linears: ``c_attn`` (q | k | v of the heads held here), the core over those
    heads, ``c_proj``. ``CausalSelfAttention`` holds every head; the TP twin (``tpsim.tp.attention``) a few.

    ``head_index``: the global numbers of the heads held here (None: all of them), so a head-sharded layer
    draws the serial model's dropout bits for its heads.
    """

    def __init__(self, c_attn: Module, c_proj: Module, heads: int, *, attn_dropout: float = 0.0,
                 head_index: np.ndarray | None = None) -> None:
        super().__init__()
        if not 0.0 <= attn_dropout < 1.0:
            raise ValueError(f"attn_dropout must be in [0, 1), got {attn_dropout}")
        self.c_attn, self.c_proj = c_attn, c_proj
        self.hidden, self.heads = c_attn.in_features, heads
        self.head_dim = self.hidden // heads
        self.attn_dropout = float(attn_dropout)
        self.head_index = head_index
        self.heads_per_partition = heads if head_index is None else len(head_index)
        self.context = None  # context parallelism: a tpsim.cp.context.ContextParallel, set by the model's build

    def sequence_length(self, x: np.ndarray) -> int:
        """The whole sequence the core attends over, from ``x: [b, s, h]`` (a sequence-parallel layer's is longer)."""
        return x.shape[1]

    def forward(self, x: np.ndarray, plan: DropoutPlan = DropoutPlan()) -> tuple[np.ndarray, AttentionCache]:
        """``x: [b, s, h]`` (SP: ``[b, s/p, h]``) -> ``(y shaped as x, cache)``. Dropout on the probabilities needs
        ``plan.rng``; ``plan.batch_index``: the global batch positions of the local rows (default all)."""
        b, s = x.shape[0], self.sequence_length(x)
        qkv, c_attn = self.c_attn.forward(x)  # TP: [b, s, 3h/p], f: identity forward (SP: f̄ all-gathers s)
        if self.context is not None:  # CP: this rank's s/C tokens against the whole sequence (tpsim.cp)
            ctx, core = self._context_forward(qkv, plan, b, s)
        else:
            keep = attention_keep_mask(plan, self.attn_dropout, self.path + ".attn_dropout", b, self.heads, s,
                                       head_index=self.head_index)
            ctx, core = qkv_attention_forward(qkv, self.heads_per_partition, keep, self.attn_dropout)
        y, c_proj = self.c_proj.forward(ctx)  # TP: g, the one all-reduce of the forward (SP: ḡ reduce-scatter)
        return y, AttentionCache(c_attn, core, c_proj)

    def _context_forward(self, qkv: np.ndarray, plan: DropoutPlan, b: int, s: int):
        """The core across the CP group: ``self.context`` (a ``tpsim.cp.context.ContextParallel``) attends; the
        dropout mask of each block is drawn at its absolute query and key positions."""
        heads = np.arange(self.heads) if self.head_index is None else np.asarray(self.head_index)

        def keep(q_pos, k_pos, local):
            return attention_keep_mask(plan, self.attn_dropout, self.path + ".attn_dropout", b, self.heads,
                                       s * self.context.size, heads[local if local is not None else slice(None)],
                                       q_pos, k_pos)
        q, k, v = (split_heads(t, self.heads_per_partition) for t in np.split(qkv, 3, axis=-1))
        with_dropout = self.attn_dropout > 0 and plan.rng is not None
        ctx, core = self.context.forward(q, k, v, keep if with_dropout else None, self.attn_dropout,
                                         scope=self.path)
        return merge_heads(ctx), core

    def backward(self, dy: np.ndarray, cache: AttentionCache) -> np.ndarray:
        """``dy`` shaped as the output -> ``dx`` shaped as the input; adds into the grads of c_attn and c_proj."""
        dctx = self.c_proj.backward(dy, cache.c_proj)  # TP: g backward, the identity
        if self.context is not None:  # CP: the backward ring (or gather, or all-to-all) of tpsim.cp
            grads = self.context.backward(split_heads(dctx, self.heads_per_partition), cache.core)
            dqkv = np.concatenate([merge_heads(g) for g in grads], axis=-1)
        else:
            dqkv = qkv_attention_backward(dctx, cache.core)  # local: the heads held here only
        return self.c_attn.backward(dqkv, cache.c_attn)  # TP: f backward, the one all-reduce of the backward


class CausalSelfAttention(MultiHeadAttention):
    """Serial GPT-2 attention: ``c_attn: Linear(h, 3h)`` (q | k | v), ``c_proj: Linear(h, h)``; ``attn_dropout`` = p."""

    def __init__(self, hidden: int, heads: int, *, rng: np.random.Generator | None = None, dtype=np.float64,
                 std: float = 0.02, proj_std: float | None = None, attn_dropout: float = 0.0) -> None:
        if heads < 1 or hidden % heads:
            raise ValueError(f"hidden = {hidden} must be divisible by heads = {heads} (head_dim = hidden / heads)")
        if not 0.0 <= attn_dropout < 1.0:  # before drawing anything
            raise ValueError(f"attn_dropout must be in [0, 1), got {attn_dropout}")
        rng = np.random.default_rng(0) if rng is None else rng
        c_attn = Linear(hidden, 3 * hidden, rng=rng, dtype=dtype, std=std)
        c_proj = Linear(hidden, hidden, rng=rng, dtype=dtype, std=std if proj_std is None else proj_std)
        super().__init__(c_attn, c_proj, heads, attn_dropout=attn_dropout)

    def __repr__(self) -> str:
        return f"CausalSelfAttention(hidden={self.hidden}, heads={self.heads}, attn_dropout={self.attn_dropout})"
