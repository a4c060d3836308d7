"""Grouped-query attention split by heads over TP, with KV heads split *or replicated* (Ainslie et al. 2023,
arXiv:2305.13245; the head split of Shoeybi et al. 2019, §3).

Query heads split as in GPT attention: rank r holds heads / tp whole q heads. Query head j reads KV head
j // n_rep (n_rep = heads / kv_heads), so a rank's q heads need a contiguous run of KV heads:

    kv_heads % tp == 0   each rank holds kv_heads / tp KV heads — its own, nobody else's
    tp % kv_heads == 0   each KV head is *replicated* on rep = tp / kv_heads ranks: rank r holds KV head
                         r // rep (what vLLM and Megatron-LM do when TP exceeds the KV heads)
    otherwise            a rank's q heads would need part of a KV head: refused (``ConfigError``)

    tp 4, heads 8, kv 2:  rank 0: q 0,1 kv 0 | rank 1: q 2,3 kv 0 | rank 2: q 4,5 kv 1 | rank 3: q 6,7 kv 1

**The gradient of a replicated KV head.** Each of its rep ranks computes dW_k, dW_v from *its own* q heads
only: a partial sum. The serial gradient is the sum over all n_rep q heads, so the rep ranks that share the
head all-reduce (dW_k, dW_v) — one [2, h, hd·local_kv] message per layer — in a sub-group of the TP group
(``kv``, made by ``Group.split``: ranks {c·rep, ..., c·rep + rep − 1} share KV head c). It is traced with
scope = the attention's path and phase ``backward``, like f's all-reduce. Afterwards the rep copies hold the
same gradient, so an optimizer step keeps them identical; their ``Partition.replica`` numbers the copies so
a gradient norm counts each KV head once. Only the new contribution is reduced, before it is added to grads.

q_proj, k_proj, v_proj read one input, so they enter the TP region together (``tpsim.tp.shared_input``):
one all-reduce of [b, s, h] in the backward (f), one in the forward (g, in the row-parallel o_proj).
RoPE rotates each head at each position on its own: no communication.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.errors import ConfigError
from tpsim.nn.attention import merge_heads, split_heads
from tpsim.nn.dropout import DropoutPlan
from tpsim.nn.gqa_attention import GQAttention, GQAttentionCache, gqa_core_backward, gqa_core_forward
from tpsim.nn.module import Module
from tpsim.nn.rope import rope_cos_sin
from tpsim.phases import BACKWARD
from tpsim.tp.column_parallel import ColumnParallelLinear
from tpsim.tp.row_parallel import RowParallelLinear
from tpsim.tp.shared_input import shared_input_backward, shared_input_forward


def check_gqa_layout(hidden: int, heads: int, kv_heads: int, tp: int) -> None:
    """Raise ``ConfigError`` (the same on every rank, before any collective) for a layout that cannot work."""
    if heads < 1 or hidden % heads:
        raise ConfigError(f"hidden = {hidden} is not divisible by heads = {heads}")
    if kv_heads < 1 or heads % kv_heads:
        raise ConfigError(f"heads = {heads} is not a multiple of kv_heads = {kv_heads}")
    if heads % tp:
        raise ConfigError(f"heads = {heads} is not divisible by tp = {tp}: attention is split by whole heads")
    if kv_heads % tp and tp % kv_heads:
        raise ConfigError(f"kv_heads = {kv_heads} and tp = {tp}: neither divides the other, so some rank "
                          f"would need part of a KV head (use a tp that divides kv_heads or a multiple of it)")


def kv_head_layout(heads: int, kv_heads: int, tp: int, tp_rank: int) -> tuple[np.ndarray, int]:
    """``(global KV heads this rank holds, replicas)``: how many TP ranks hold each of them (1 = split)."""
    if kv_heads % tp == 0:
        local = kv_heads // tp
        return np.arange(tp_rank * local, (tp_rank + 1) * local), 1
    rep = tp // kv_heads
    return np.array([tp_rank // rep]), rep


def kv_columns(kv_index: np.ndarray, head_dim: int) -> np.ndarray:
    """Master columns of k_proj (or v_proj) [h, kv·hd] holding the KV heads ``kv_index``."""
    return np.concatenate([np.arange(c * head_dim, (c + 1) * head_dim) for c in kv_index])


def kv_group(tp_group: Group, heads: int, kv_heads: int) -> Group | None:
    """The sub-group of TP ranks sharing this rank's KV head(s), or None when KV heads are split (rep = 1).

    Collective over ``tp_group`` (create it once per model and pass it to every layer).
    """
    _, rep = kv_head_layout(heads, kv_heads, tp_group.size, tp_group.rank)
    return None if rep == 1 else tp_group.split(tp_group.rank // rep, "kv")


class ParallelGQAttention(Module):
    """Grouped-query attention over ``heads / tp`` q heads per rank; the TP twin of ``GQAttention``."""

    def __init__(self, q_proj: ColumnParallelLinear, k_proj: ColumnParallelLinear, v_proj: ColumnParallelLinear,
                 o_proj: RowParallelLinear, heads: int, kv_heads: int, *, rope_theta: float = 10000.0,
                 kv_sync: Group | None = None) -> None:
        super().__init__()
        group = q_proj.group
        self.group, self.sequence_parallel = group, q_proj.sequence_parallel
        self.hidden, self.heads, self.kv_heads = q_proj.in_features, heads, kv_heads
        self.head_dim, self.rope_theta = self.hidden // heads, float(rope_theta)
        self.heads_per_partition = heads // group.size
        self.kv_index, self.kv_replicas = kv_head_layout(heads, kv_heads, group.size, group.rank)
        if (self.kv_replicas > 1) != (kv_sync is not None) or (kv_sync and kv_sync.size != self.kv_replicas):
            raise ValueError(f"KV heads replicated on {self.kv_replicas} ranks need kv_sync = kv_group(...) "
                             f"of that size, got {kv_sync}")
        self.kv_sync = kv_sync
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = q_proj, k_proj, v_proj, o_proj

    @classmethod
    def from_serial(cls, attn: GQAttention, group: Group, *, sequence_parallel: bool = False,
                    kv_sync: Group | None = None) -> "ParallelGQAttention":
        """Shard a serial layer: whole q heads, this rank's KV heads (a replica if shared), o_proj's rows."""
        check_gqa_layout(attn.hidden, attn.heads, attn.kv_heads, group.size)
        kv_index, rep = kv_head_layout(attn.heads, attn.kv_heads, group.size, group.rank)
        sp, cols = sequence_parallel, kv_columns(kv_index, attn.head_dim)
        q = ColumnParallelLinear.from_serial(attn.q_proj, group, gather_output=False, sequence_parallel=sp)
        k, v = (ColumnParallelLinear.from_serial(lin, group, gather_output=False, columns=cols, sequence_parallel=sp)
                for lin in (attn.k_proj, attn.v_proj))
        for lin in (k, v):  # copy number group.rank % rep of a replicated KV head: only copy 0 counts in norms
            part = lin.partition["weight"]
            lin.partition["weight"] = type(part)(part.dim, part.index, part.full, replica=group.rank % rep)
        o = RowParallelLinear.from_serial(attn.o_proj, group, input_is_parallel=True, sequence_parallel=sp)
        return cls(q, k, v, o, attn.heads, attn.kv_heads, rope_theta=attn.rope_theta, kv_sync=kv_sync)

    def forward(self, x: np.ndarray, plan: DropoutPlan = DropoutPlan(),
                positions: np.ndarray | None = None) -> tuple[np.ndarray, GQAttentionCache]:
        """``x: [b, s, h]`` replicated (SP: ``[b, s/p, h]``) -> ``(y shaped as x, cache)``; ``plan`` unused."""
        s = x.shape[1] * (self.group.size if self.sequence_parallel else 1)  # the whole sequence after f̄
        positions = np.arange(s) if positions is None else positions
        cos, sin = rope_cos_sin(positions, self.head_dim, self.rope_theta, x.dtype)  # no communication
        weights = [m.params["weight"] for m in (self.q_proj, self.k_proj, self.v_proj)]
        with self.group.tracer.region(scope=self.path):
            (q, k, v), (c_q, c_k, c_v) = shared_input_forward(x, weights, self.group, self.sequence_parallel)
        nkv = len(self.kv_index)
        ctx, core = gqa_core_forward(split_heads(q, self.heads_per_partition), split_heads(k, nkv),
                                     split_heads(v, nkv), cos, sin)
        y, c_o = self.o_proj.forward(merge_heads(ctx))  # g: the one all-reduce of the forward
        return y, GQAttentionCache(c_q, c_k, c_v, core, c_o)

    def backward(self, dy: np.ndarray, cache: GQAttentionCache) -> np.ndarray:
        """``dy`` shaped as the output -> ``dx`` shaped as the input; adds into the shards' grads."""
        dctx = self.o_proj.backward(dy, cache.o_proj)
        dq, dk, dv = gqa_core_backward(split_heads(dctx, self.heads_per_partition), cache.core)
        with self.group.tracer.region(scope=self.path):
            dx, (dwq, dwk, dwv) = shared_input_backward([merge_heads(dq), merge_heads(dk), merge_heads(dv)],
                                                        [cache.q_proj, cache.k_proj, cache.v_proj],
                                                        self.group, self.sequence_parallel)
            if self.kv_sync is not None:  # partial sums over this rank's q heads -> the KV head's whole gradient
                with self.group.tracer.region(phase=BACKWARD):
                    dwk, dwv = self.kv_sync.all_reduce(np.stack([dwk, dwv]))
        self.q_proj.grads["weight"] += dwq
        self.k_proj.grads["weight"] += dwk
        self.v_proj.grads["weight"] += dwv
        return dx

    def __repr__(self) -> str:
        return (f"ParallelGQAttention(heads={self.heads}, kv_heads={self.kv_heads}, tp={self.group.size}, "
                f"kv heads here {self.kv_index.tolist()} x{self.kv_replicas})")
