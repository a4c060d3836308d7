"""Causal self-attention with grouped-query heads and RoPE, serial — Llama's ``LlamaAttention``.

Grouped-query attention (Ainslie et al. 2023, arXiv:2305.13245): ``heads`` query heads share ``kv_heads``
key/value heads, ``n_rep = heads / kv_heads`` query heads per KV head (query head j reads KV head j // n_rep,
Hugging Face's ``repeat_kv``). kv_heads = heads is multi-head attention, kv_heads = 1 multi-query attention.

    x [b, s, h] --q_proj--> [b, s, heads·hd]    -> q [b, heads, s, hd]      (separate projections, no biases)
                --k_proj--> [b, s, kv·hd]       -> k [b, kv, s, hd]         (hd = h / heads)
                --v_proj--> [b, s, kv·hd]       -> v [b, kv, s, hd]
      q, k <- RoPE(q), RoPE(k)     (Su et al. 2021; ``tpsim.nn.rope``)
      ctx = the attention core (``tpsim.nn.attention``) -> [b, s, heads·hd] --o_proj--> y [b, s, h]
            serially: k, v <- each KV head repeated n_rep times along the head axis, then causal attention

Backward: the core gives dq and the gradients of the *repeated* k and v; each KV head's gradient is the sum
over the n_rep query heads that read it (the backward of a repeat is a sum), then RoPE's inverse rotation on
dq and dk, then the four linears. The layer takes any numbers of heads, so ``GroupedQueryAttention`` runs on
the heads its parts hold: all (``GQAttention``) or a rank's share (the tensor-parallel twin,
``tpsim.tp.gqa_attention``), the same forward and backward. RoPE turns q and k at the positions the core names
(``core.positions``: 0..s-1 serially, a CP rank's own tokens under ``tpsim.cp``), before the core. q_proj,
k_proj and v_proj read one input and run as one multi-output linear (``tpsim.nn.multi_output_linear``). No
attention dropout (Llama's is 0).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.nn.attention import SERIAL_CORE, AttentionCore, merge_heads, split_heads
from tpsim.nn.dropout import DropoutPlan
from tpsim.nn.linear import Linear, LinearCache
from tpsim.nn.module import Module
from tpsim.nn.multi_output_linear import MultiOutputLinear
from tpsim.nn.rope import (RopeCache, partial_rope_backward, partial_rope_forward, rope_backward, rope_cos_sin,
                           rope_forward)


class GQACoreCache(NamedTuple):
    core: tuple  # what the attention core keeps (``SerialCoreCache`` serially), over q and k after RoPE
    rope: RopeCache


class GQAttentionCache(NamedTuple):
    """The cache of ``GroupedQueryAttention`` (serial or parallel)."""

    qkv: tuple  # the caches of q_proj, k_proj, v_proj (one multi-output linear)
    core: GQACoreCache
    o_proj: LinearCache


def check_gqa_sizes(hidden: int, heads: int, kv_heads: int) -> None:
    """Raise ``ValueError`` unless the heads fit: hidden % heads, heads % kv_heads, an even head_dim."""
    if heads < 1 or hidden % heads:
        raise ValueError(f"hidden = {hidden} must be divisible by heads = {heads} (head_dim = hidden / heads)")
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"heads = {heads} must be a multiple of kv_heads = {kv_heads}")
    if (hidden // heads) % 2:
        raise ValueError(f"head_dim = {hidden // heads} must be even for RoPE")


class GroupedQueryAttention(Module):
    """Llama attention from its parts: ``qkv`` (a multi-output linear of q_proj, k_proj, v_proj) and ``o_proj``.

    ``heads_per_partition``/``kv_heads_per_partition``: the query and KV heads ``qkv`` holds here (default all
    of them: the serial layer ``GQAttention``; the TP twin ``tpsim.tp.gqa_attention`` holds a rank's share).
    ``core``: the attention core after RoPE (``tpsim.nn.attention.SERIAL_CORE``; context parallelism's
    ``tpsim.cp.context.ContextParallel``), which also names the positions RoPE rotates by. ``rotary_dim``: the
    features of each head RoPE turns (default all; Nemotron's half, ``tpsim.nn.rope.partial_rope_forward``).
    """

    def __init__(self, qkv: Module, o_proj: Module, heads: int, kv_heads: int, *, rope_theta: float = 10000.0,
                 heads_per_partition: int | None = None, kv_heads_per_partition: int | None = None,
                 core: AttentionCore = SERIAL_CORE, rotary_dim: int | None = None) -> None:
        super().__init__()
        self.qkv, self.o_proj = qkv, o_proj  # qkv is inline: its parts are named self_attn.q_proj, ...
        self.hidden, self.heads, self.kv_heads = qkv.in_features, heads, kv_heads
        self.head_dim, self.rope_theta = self.hidden // heads, float(rope_theta)
        self.rotary_dim = self.head_dim if rotary_dim is None else rotary_dim
        if not (0 < self.rotary_dim <= self.head_dim and self.rotary_dim % 2 == 0):
            raise ValueError(f"rotary_dim = {self.rotary_dim} must be even and in 1 .. head_dim = {self.head_dim}")
        self.rope = ((rope_forward, rope_backward) if self.rotary_dim == self.head_dim
                     else (partial_rope_forward, partial_rope_backward))
        self.heads_per_partition = heads if heads_per_partition is None else heads_per_partition
        self.kv_heads_per_partition = kv_heads if kv_heads_per_partition is None else kv_heads_per_partition
        self.core = core

    # the three projections under their Hugging Face names (they live in qkv)
    q_proj = property(lambda self: self.qkv.q_proj)
    k_proj = property(lambda self: self.qkv.k_proj)
    v_proj = property(lambda self: self.qkv.v_proj)

    def sequence_length(self, x: np.ndarray) -> int:
        """The whole sequence the core attends over, from ``x: [b, s, h]`` (a sequence-parallel layer's is longer)."""
        return x.shape[1]

    def forward(self, x: np.ndarray, plan: DropoutPlan = DropoutPlan(),
                positions: np.ndarray | None = None) -> tuple[np.ndarray, GQAttentionCache]:
        """``x: [b, s, h]`` (SP: ``[b, s/p, h]``) -> ``(y shaped as x, cache)``; ``positions`` default
        ``arange(s)`` over the whole sequence; ``plan`` unused (no attention dropout)."""
        s = self.sequence_length(x)
        if positions is None:  # the absolute positions of the rows held here (CP: this rank's tokens)
            positions = self.core.positions(s)
        cos, sin = rope_cos_sin(positions, self.rotary_dim, self.rope_theta, x.dtype)  # no communication
        (q, k, v), c_qkv = self.qkv.forward(x)  # TP: f once for the three (SP: f̄ all-gathers s once)
        nq, nkv = self.heads_per_partition, self.kv_heads_per_partition
        q, rope = self.rope[0](split_heads(q, nq), cos, sin)
        k, _ = self.rope[0](split_heads(k, nkv), cos, sin)
        ctx, core = self.core.forward(q, k, split_heads(v, nkv), scope=self.path)  # CP: across the CP group
        y, c_o = self.o_proj.forward(merge_heads(ctx))  # TP: g, the one all-reduce of the forward
        return y, GQAttentionCache(c_qkv, GQACoreCache(core, rope), c_o)

    def backward(self, dy: np.ndarray, cache: GQAttentionCache) -> np.ndarray:
        """``dy`` shaped as the output -> ``dx`` shaped as the input; adds into the four projections' grads."""
        dctx = split_heads(self.o_proj.backward(dy, cache.o_proj), self.heads_per_partition)
        dq, dk, dv = self.core.backward(dctx, cache.core.core)  # each KV head's gradient summed over its readers
        dq, dk = self.rope[1](dq, cache.core.rope), self.rope[1](dk, cache.core.rope)
        return self.qkv.backward((merge_heads(dq), merge_heads(dk), merge_heads(dv)), cache.qkv)


class GQAttention(GroupedQueryAttention):
    """Serial: ``q_proj: Linear(h, heads·hd)``, ``k_proj, v_proj: Linear(h, kv·hd)``,
    ``o_proj: Linear(heads·hd, h)``."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, *, rope_theta: float = 10000.0,
                 rng: np.random.Generator | None = None, dtype=np.float64, std: float = 0.02,
                 rotary_dim: int | None = None) -> None:
        check_gqa_sizes(hidden, heads, kv_heads)
        rng = np.random.default_rng(0) if rng is None else rng
        hd = hidden // heads
        q, k, v, o = (Linear(n_in, n_out, bias=False, rng=rng, dtype=dtype, std=std) for n_in, n_out in
                      ((hidden, heads * hd), (hidden, kv_heads * hd), (hidden, kv_heads * hd), (heads * hd, hidden)))
        super().__init__(MultiOutputLinear({"q_proj": q, "k_proj": k, "v_proj": v}), o, heads, kv_heads,
                         rope_theta=rope_theta, rotary_dim=rotary_dim)

    def __repr__(self) -> str:
        return f"GQAttention(hidden={self.hidden}, heads={self.heads}, kv_heads={self.kv_heads})"
