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

The layer reaches the core through an *attention core* object it is given at construction, as a TP layer is
given its ``Region`` (``AttentionCore``: ``forward(q, k, v, keep, p) -> (ctx, cache)``, ``backward(dctx, cache)
-> (dq, dk, dv)``, ``positions(s)``, ``size``). ``SERIAL_CORE`` (the default) runs the functions below on the
rows held here; context parallelism hands in ``tpsim.cp.context.ContextParallel``, whose queries attend over
the whole sequence across the CP group. The layer never asks which one it holds.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Protocol

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


# --- the attention core a layer is built with -------------------------------------------------------------------
KeepFn = Callable[..., "np.ndarray | None"]  # keep(q_index, k_index, local_heads) -> bool mask; None: all of each


class AttentionCore(Protocol):
    """What an attention layer calls between its projections (``SerialCore``; CP: ``tpsim.cp.context``).

    ``forward(q [b, nh, s, hd], k, v [b, nkv, s, hd], keep, p, scope=) -> (ctx [b, nh, s, hd], cache)``: causal
    attention of the rows held here (nh a multiple of nkv: grouped-query heads read KV head j // (nh / nkv));
    ``keep(q_index, k_index, local_heads)`` draws attention dropout's mask at absolute positions (None: all),
    or is None. ``backward(dctx, cache) -> (dq, dk, dv)`` shaped as q, k, v. ``positions(s)``: the absolute
    positions of the ``s`` rows held here; ``size``: the ranks the sequence is cut over; ``sequence_plan(plan,
    s)``: the dropout plan naming those positions."""

    size: int

    def positions(self, local: int) -> np.ndarray: ...
    def sequence_plan(self, plan: DropoutPlan, local: int) -> DropoutPlan: ...
    def forward(self, q, k, v, keep: KeepFn | None = None, p: float = 0.0, *, scope: str | None = None): ...
    def backward(self, dctx: np.ndarray, cache) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


class SerialCoreCache(NamedTuple):
    attention: AttentionCoreCache  # over the repeated KV heads [b, nh, s, hd]
    n_rep: int  # query heads per KV head (1: multi-head attention)


class SerialCore:
    """The attention core of one device: the rows held here are the whole sequence, at positions 0..s-1.

    Grouped-query K and V are repeated to the query heads first (Hugging Face's ``repeat_kv``; as is for
    multi-head attention) and their gradients summed back over the copies. Holds nothing: one instance serves
    every layer (``SERIAL_CORE``)."""

    size = 1

    def positions(self, local: int) -> np.ndarray:
        """``arange(local)``: the rows are the sequence itself."""
        return np.arange(local)

    def sequence_plan(self, plan: DropoutPlan, local: int) -> DropoutPlan:
        """``plan`` as is: the rows are every position."""
        return plan

    def forward(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: KeepFn | None = None, p: float = 0.0, *,
                scope: str | None = None) -> tuple[np.ndarray, SerialCoreCache]:
        """``(ctx [b, nh, s, hd], cache)``; ``scope`` unused (nothing is sent)."""
        n_rep = q.shape[1] // k.shape[1]
        mask = None if keep is None else keep(None, None, None)
        ctx, cache = attention_core_forward(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask, p)
        return ctx, SerialCoreCache(cache, n_rep)

    def backward(self, dctx: np.ndarray, cache: SerialCoreCache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(dq [b, nh, s, hd], dk, dv [b, nkv, s, hd])``."""
        dq, dk, dv = attention_core_backward(dctx, cache.attention)
        return dq, fold_kv(dk, cache.n_rep), fold_kv(dv, cache.n_rep)


SERIAL_CORE = SerialCore()  # stateless, so shared: every layer built without a core attends serially


def repeat_kv(x: np.ndarray, n_rep: int) -> np.ndarray:
    """``[b, nkv, s, hd]`` -> ``[b, nkv·n_rep, s, hd]``, each KV head n_rep times in a row (``x`` itself at 1)."""
    return x if n_rep == 1 else np.repeat(x, n_rep, axis=1)


def fold_kv(dx: np.ndarray, n_rep: int) -> np.ndarray:
    """``repeat_kv``'s backward: the gradient of each KV head, summed over its n_rep adjacent copies."""
    if n_rep == 1:
        return dx
    b, nh, s, hd = dx.shape
    return dx.reshape(b, nh // n_rep, n_rep, s, hd).sum(axis=2)


class AttentionCache(NamedTuple):
    """The cache of ``MultiHeadAttention`` (serial or parallel)."""

    c_attn: LinearCache
    core: tuple  # what the attention core keeps (``SerialCoreCache`` serially)
    c_proj: LinearCache


# --- the layer, written once -------------------------------------------------------------------------------------
class MultiHeadAttention(Module):
    """GPT-2 attention from its two linears: ``c_attn`` (q | k | v of the heads held here), the core over those
    heads, ``c_proj``. ``CausalSelfAttention`` holds every head; the TP twin (``tpsim.tp.attention``) a few.

    ``head_index``: the global numbers of the heads held here (None: all of them), so a head-sharded layer
    draws the serial model's dropout bits for its heads. ``core``: the attention core (``SERIAL_CORE``; context
    parallelism's ``tpsim.cp.context.ContextParallel``).
    """

    def __init__(self, c_attn: Module, c_proj: Module, heads: int, *, attn_dropout: float = 0.0,
                 head_index: np.ndarray | None = None, core: AttentionCore = SERIAL_CORE) -> None:
        super().__init__()
        if not 0.0 <= attn_dropout < 1.0:
            raise ValueError(f"attn_dropout must be in [0, 1), got {attn_dropout}")
        self.c_attn, self.c_proj = c_attn, c_proj
        self.hidden, self.heads = c_attn.in_features, heads
        self.head_dim = self.hidden // heads
        self.attn_dropout = float(attn_dropout)
        self.head_index = head_index
        self.heads_per_partition = heads if head_index is None else len(head_index)
        self.core = core

    def sequence_length(self, x: np.ndarray) -> int:
        """The rows the core attends with, from ``x: [b, s, h]`` (a sequence-parallel layer's are more)."""
        return x.shape[1]

    def forward(self, x: np.ndarray, plan: DropoutPlan = DropoutPlan()) -> tuple[np.ndarray, AttentionCache]:
        """``x: [b, s, h]`` (SP: ``[b, s/p, h]``) -> ``(y shaped as x, cache)``. Dropout on the probabilities needs
        ``plan.rng``; ``plan.batch_index``: the global batch positions of the local rows (default all)."""
        qkv, c_attn = self.c_attn.forward(x)  # TP: [b, s, 3h/p], f: identity forward (SP: f̄ all-gathers s)
        q, k, v = (split_heads(t, self.heads_per_partition) for t in np.split(qkv, 3, axis=-1))
        with_dropout = self.attn_dropout > 0 and plan.rng is not None
        keep = self._keep(plan, x.shape[0], self.sequence_length(x)) if with_dropout else None
        ctx, core = self.core.forward(q, k, v, keep, self.attn_dropout, scope=self.path)
        y, c_proj = self.c_proj.forward(merge_heads(ctx))  # TP: g, the one all-reduce of the forward (SP: ḡ)
        return y, AttentionCache(c_attn, core, c_proj)

    def _keep(self, plan: DropoutPlan, b: int, s: int) -> KeepFn:
        """The dropout mask the core asks for, ``keep(q_index, k_index, local_heads)``: drawn at the absolute query
        and key positions of a sequence of ``s · core.size`` tokens (None: all of them), for the global numbers of
        the local heads ``local_heads`` (a slice of those held here; None: all)."""
        heads = np.arange(self.heads) if self.head_index is None else np.asarray(self.head_index)

        def keep(q_index=None, k_index=None, local=None):
            return attention_keep_mask(plan, self.attn_dropout, self.path + ".attn_dropout", b, self.heads,
                                       s * self.core.size, self.head_index if local is None else heads[local],
                                       q_index, k_index)
        return keep

    def backward(self, dy: np.ndarray, cache: AttentionCache) -> np.ndarray:
        """``dy`` shaped as the output -> ``dx`` shaped as the input; adds into the grads of c_attn and c_proj."""
        dctx = self.c_proj.backward(dy, cache.c_proj)  # TP: g backward, the identity
        grads = self.core.backward(split_heads(dctx, self.heads_per_partition), cache.core)  # CP: its messages
        dqkv = np.concatenate([merge_heads(g) for g in grads], axis=-1)  # local: the heads held here only
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
