"""Self-attention split by heads — Megatron-LM's ParallelAttention (Shoeybi et al. 2019, §3 and Fig. 3b).

Heads are independent from q·kᵀ to probs·v, so each of the p ranks takes heads / p whole heads and runs the
serial core on them alone. The two linears around the core are the MLP's pair again:

    x [b, s, h] --f--> c_attn_i (column-parallel) -> qkv_i [b, s, 3h/p] = q_i | k_i | v_i
                       attention over this rank's heads_per_partition heads  -> ctx_i [b, s, h/p]
                       c_proj_i (row-parallel) -> partial [b, s, h] --g--> y [b, s, h]

Exactly one all-reduce of the [b, s, h] activation forward (g in c_proj) and one backward (f in c_attn).
With ``sequence_parallel=True`` the input and output are sequence shards [b, s/p, h]: c_attn all-gathers the
sequence (f̄) and c_proj reduce-scatters it (ḡ); the core in between sees the whole sequence, as it must.

The *qkv layout trap*: c_attn's master weight is [h, 3h] with columns q | k | v. A naive contiguous split of
those 3h columns gives rank 0 of 2 all of q and half of k — no whole head anywhere. Rank i must instead hold
the q, k *and* v columns of its heads, so ``c_attn`` picks them with ``columns=``:

    head_columns(h, heads, p, i) = [q cols of heads i·nh..] ++ [h + same] ++ [2h + same],   nh = heads / p

c_proj's rows are the context columns of the same heads, which *are* contiguous: its default split fits.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.errors import ConfigError
from tpsim.nn.attention import (AttentionCache, CausalSelfAttention, attention_keep_mask, qkv_attention_backward,
                                qkv_attention_forward)
from tpsim.nn.dropout import DropoutPlan
from tpsim.nn.module import Module
from tpsim.tp.column_parallel import ColumnParallelLinear
from tpsim.tp.row_parallel import RowParallelLinear


def check_attention_sizes(hidden: int, heads: int, tp: int) -> None:
    """Raise ``ConfigError`` (the same on every rank, before any collective) unless the heads split evenly."""
    if heads < 1 or hidden % heads:
        raise ConfigError(f"hidden = {hidden} is not divisible by heads = {heads}")
    if heads % tp:
        raise ConfigError(f"heads = {heads} is not divisible by the tensor-parallel size tp = {tp}: "
                          f"attention is split by whole heads")


def head_columns(hidden: int, heads: int, tp: int, tp_rank: int) -> np.ndarray:
    """Master columns of c_attn [h, 3h] that rank ``tp_rank`` holds: its heads' q, then k, then v columns."""
    check_attention_sizes(hidden, heads, tp)
    width = hidden // tp  # = heads_per_partition · head_dim
    mine = np.arange(tp_rank * width, (tp_rank + 1) * width)
    return np.concatenate([mine, hidden + mine, 2 * hidden + mine])


class ParallelSelfAttention(Module):
    """Causal self-attention over ``heads / tp`` whole heads per rank; the TP twin of ``CausalSelfAttention``."""

    def __init__(self, c_attn: ColumnParallelLinear, c_proj: RowParallelLinear, heads: int, *,
                 attn_dropout: float = 0.0) -> None:
        super().__init__()
        group = c_attn.group
        hidden = c_attn.in_features
        check_attention_sizes(hidden, heads, group.size)
        if c_attn.gather_output or not c_proj.input_is_parallel:
            raise ValueError("ParallelSelfAttention needs c_attn(gather_output=False) and "
                             "c_proj(input_is_parallel=True)")
        if c_attn.sequence_parallel != c_proj.sequence_parallel:
            raise ValueError("ParallelSelfAttention needs c_attn and c_proj both sequence-parallel or both not")
        expected = head_columns(hidden, heads, group.size, group.rank)
        if not np.array_equal(c_attn.columns, expected):  # the layout trap, caught at construction
            raise ValueError("c_attn must hold the q, k and v columns of whole heads (columns=head_columns(...)), "
                             "not a contiguous block of the 3h columns")
        if not 0.0 <= attn_dropout < 1.0:
            raise ValueError(f"attn_dropout must be in [0, 1), got {attn_dropout}")
        self.group, self.c_attn, self.c_proj = group, c_attn, c_proj
        self.sequence_parallel = c_attn.sequence_parallel
        self.hidden, self.heads, self.head_dim = hidden, heads, hidden // heads
        self.heads_per_partition = heads // group.size
        self.attn_dropout = float(attn_dropout)
        first = group.rank * self.heads_per_partition
        self.head_index = np.arange(first, first + self.heads_per_partition)  # this rank's global head numbers

    @classmethod
    def from_serial(cls, attn: CausalSelfAttention, group: Group, *,
                    sequence_parallel: bool = False) -> "ParallelSelfAttention":
        """Shard a serial layer's master weights: whole heads of c_attn, the matching rows of c_proj.

        A fresh model: shard a fresh ``CausalSelfAttention(...)`` (same on every rank for the same ``rng`` seed).
        """
        check_attention_sizes(attn.hidden, attn.heads, group.size)
        columns = head_columns(attn.hidden, attn.heads, group.size, group.rank)
        sp = sequence_parallel
        return cls(ColumnParallelLinear.from_serial(attn.c_attn, group, gather_output=False, columns=columns,
                                                    sequence_parallel=sp),
                   RowParallelLinear.from_serial(attn.c_proj, group, input_is_parallel=True, sequence_parallel=sp),
                   attn.heads, attn_dropout=attn.attn_dropout)

    def forward(self, x: np.ndarray, plan: DropoutPlan = DropoutPlan()) -> tuple[np.ndarray, AttentionCache]:
        """``x: [b, s, h]`` replicated -> ``(y [b, s, h] replicated, cache)``.

        Sequence-parallel: ``x: [b, s/p, h]`` this rank's positions -> ``y: [b, s/p, h]`` the same positions.
        ``plan.batch_index``: global batch positions of the local rows (default all), so a data-parallel rank
        draws the same dropout bits as the serial model does for those rows.
        """
        b, s = x.shape[0], x.shape[1] * (self.group.size if self.sequence_parallel else 1)  # s: whole sequence
        keep = attention_keep_mask(plan, self.attn_dropout, self.path + ".attn_dropout", b, self.heads, s,
                                   head_index=self.head_index)
        qkv, c_attn = self.c_attn.forward(x)  # f: identity forward (SP: f̄ all-gathers s); [b, s, 3h/p]
        ctx, core = qkv_attention_forward(qkv, self.heads_per_partition, keep, self.attn_dropout)
        y, c_proj = self.c_proj.forward(ctx)  # g: the one all-reduce of the forward (SP: ḡ reduce-scatter)
        return y, AttentionCache(c_attn, core, c_proj)

    def backward(self, dy: np.ndarray, cache: AttentionCache) -> np.ndarray:
        """``dy: [b, s, h]`` -> ``dx: [b, s, h]`` (all-reduced by f in c_attn); adds into the shards' grads."""
        dctx = self.c_proj.backward(dy, cache.c_proj)  # g backward: identity
        dqkv = qkv_attention_backward(dctx, cache.core)  # local: this rank's heads only
        return self.c_attn.backward(dqkv, cache.c_attn)  # f backward: the one all-reduce of the backward

    def __repr__(self) -> str:
        return (f"ParallelSelfAttention(hidden={self.hidden}, heads={self.heads}, "
                f"heads_per_partition={self.heads_per_partition}, tp={self.group.size})")
