"""Grouped-query attention split by heads over TP, with KV heads split *or replicated* (Ainslie et al. 2023,
arXiv:2305.13245; the head split of Shoeybi et al. 2019, §3).

Query heads split as in GPT attention: rank r holds heads / tp whole q heads. Query head j reads KV head
j // n_rep (n_rep = heads / kv_heads), so a rank's q heads need a contiguous run of KV heads:

    kv_heads % tp == 0   each rank holds kv_heads / tp KV heads — its own, nobody else's
    tp % kv_heads == 0   each KV head is *replicated* on rep = tp / kv_heads ranks: rank r holds KV head
                         r // rep (what vLLM and SGLang do when TP exceeds the KV heads; Megatron-LM instead
                         requires kv_heads % tp == 0)
    otherwise            the ranks' q heads read overlapping, uneven sets of whole KV heads (heads 12, kv 6,
                         tp 4: {0, 1}, {1, 2}, {3, 4}, {4, 5}), which neither a split nor a uniform copy gives:
                         refused (``ConfigError``, from ``check_kv_layout``, which ``kv_head_layout`` calls)

    tp 4, heads 8, kv 2:  rank 0: q 0,1 kv 0 | rank 1: q 2,3 kv 0 | rank 2: q 4,5 kv 1 | rank 3: q 6,7 kv 1

**The gradient of a replicated KV head.** Each of its rep ranks computes dW_k, dW_v from *its own* q heads
only: a partial sum. The serial gradient is the sum over all n_rep q heads, so the rep ranks that share the
head all-reduce (dW_k, dW_v) — one [2, h, hd·local_kv] message per layer — in a sub-group of the TP group
(``kv``, made by ``Group.split``: ranks {c·rep, ..., c·rep + rep − 1} share KV head c). It is traced with
scope = the attention's path and phase ``backward``, like f's all-reduce. Afterwards the rep copies hold the
same gradient, so an optimizer step keeps them identical; their ``Partition.replica`` numbers the copies so
a gradient norm counts each KV head once. Only the new contribution is reduced, before it is added to grads.

q_proj, k_proj, v_proj read one input, so they are one layer that enters the TP region once
(``tpsim.tp.multi_output_column_parallel``, which also does the ``kv`` sum above for its replicated parts):
one all-reduce of [b, s, h] in the backward (f), one in the forward (g, in the row-parallel o_proj).
RoPE rotates each head at each position on its own: no communication. The forward and backward are the
serial layer's (``tpsim.nn.gqa_attention.GroupedQueryAttention``) on this rank's heads.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.errors import ConfigError
from tpsim.nn.attention import SERIAL_CORE, AttentionCore
from tpsim.nn.gqa_attention import GQAttention, GroupedQueryAttention
from tpsim.tp.multi_output_column_parallel import MultiOutputColumnParallelLinear
from tpsim.tp.regions import TP_REGION, Region
from tpsim.tp.row_parallel import RowParallelLinear


def check_kv_layout(heads: int, kv_heads: int, tp: int) -> None:
    """Raise ``ConfigError`` for query/KV heads that tpsim cannot split over ``tp`` ranks (pure arithmetic)."""
    if heads < 1 or kv_heads < 1 or tp < 1:
        raise ConfigError(f"heads, kv_heads and tp must be >= 1, got {heads}, {kv_heads}, {tp}")
    if heads % kv_heads:
        raise ConfigError(f"heads = {heads} is not a multiple of kv_heads = {kv_heads}")
    if heads % tp:
        raise ConfigError(f"heads = {heads} is not divisible by tp = {tp}: attention is split by whole heads")
    if kv_heads % tp and tp % kv_heads:
        raise ConfigError(f"kv_heads = {kv_heads} and tp = {tp}: neither divides the other, so the ranks' query "
                          f"heads would read overlapping, uneven sets of KV heads, which tpsim refuses (use a tp "
                          f"that divides kv_heads or a multiple of it)")


def check_gqa_layout(hidden: int, heads: int, kv_heads: int, tp: int) -> None:
    """Raise ``ConfigError`` (the same on every rank, before any collective) for a layout that cannot work."""
    if heads < 1 or hidden % heads:
        raise ConfigError(f"hidden = {hidden} is not divisible by heads = {heads}")
    check_kv_layout(heads, kv_heads, tp)


def kv_head_layout(heads: int, kv_heads: int, tp: int, tp_rank: int) -> tuple[np.ndarray, int]:
    """``(global KV heads this rank holds, replicas)``: how many TP ranks hold each of them (1 = split).

    Raises ``ConfigError`` for a layout ``check_kv_layout`` refuses, or a ``tp_rank`` outside ``0 .. tp − 1``.
    """
    check_kv_layout(heads, kv_heads, tp)
    if not 0 <= tp_rank < tp:
        raise ConfigError(f"tp_rank = {tp_rank} is not a rank of a TP group of {tp} (0 .. {tp - 1})")
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


class ParallelGQAttention(GroupedQueryAttention):
    """Grouped-query attention over ``heads / tp`` q heads per rank: ``GroupedQueryAttention``'s forward and
    backward on column-parallel q/k/v (one ``MultiOutputColumnParallelLinear``) and a row-parallel o_proj."""

    def __init__(self, qkv: MultiOutputColumnParallelLinear, o_proj: RowParallelLinear, heads: int, kv_heads: int,
                 *, rope_theta: float = 10000.0, core: AttentionCore = SERIAL_CORE,
                 rotary_dim: int | None = None) -> None:
        group = qkv.group
        kv_index, kv_replicas = kv_head_layout(heads, kv_heads, group.size, group.rank)
        kv_sync = qkv.replica_group
        if (kv_replicas > 1) != (kv_sync is not None) or (kv_sync and kv_sync.size != kv_replicas):
            raise ValueError(f"KV heads replicated on {kv_replicas} ranks need kv_sync = kv_group(...) of that "
                             f"size as qkv's replica_group, got {kv_sync}")
        if qkv.region is not o_proj.region or not o_proj.input_is_parallel:
            raise ValueError("ParallelGQAttention needs o_proj(input_is_parallel=True) built with qkv's region")
        super().__init__(qkv, o_proj, heads, kv_heads, rope_theta=rope_theta,
                         heads_per_partition=heads // group.size, kv_heads_per_partition=len(kv_index), core=core,
                         rotary_dim=rotary_dim)
        self.group, self.region = group, qkv.region
        self.kv_index, self.kv_replicas = kv_index, kv_replicas  # global KV heads held here; ranks holding each

    @classmethod
    def from_serial(cls, attn: GQAttention, group: Group, *, region: Region = TP_REGION,
                    kv_sync: Group | None = None, core: AttentionCore = SERIAL_CORE) -> "ParallelGQAttention":
        """Shard a serial layer: whole q heads, this rank's KV heads (copy ``kv_sync.rank`` of a shared one),
        o_proj's rows. ``kv_sync``: ``kv_group(...)`` when KV heads are replicated, else None; ``core``: the
        attention core (``tpsim.nn.attention``; CP's ``tpsim.cp.context.ContextParallel``)."""
        check_gqa_layout(attn.hidden, attn.heads, attn.kv_heads, group.size)
        kv_index, rep = kv_head_layout(attn.heads, attn.kv_heads, group.size, group.rank)
        kv = kv_columns(kv_index, attn.head_dim)
        qkv = MultiOutputColumnParallelLinear.from_serial(
            attn.qkv, group, region=region, columns={"k_proj": kv, "v_proj": kv}, replica_group=kv_sync,
            replicated=("k_proj", "v_proj") if kv_sync is not None else ())
        o = RowParallelLinear.from_serial(attn.o_proj, group, input_is_parallel=True, region=region)
        return cls(qkv, o, attn.heads, attn.kv_heads, rope_theta=attn.rope_theta, core=core,
                   rotary_dim=attn.rotary_dim)

    def sequence_length(self, x: np.ndarray) -> int:
        """The whole sequence: ``x``'s under f, p times the shard's under f̄ (RoPE's positions run over all of it)."""
        return self.region.sequence_length(x.shape[1], self.group)

    def __repr__(self) -> str:
        return (f"ParallelGQAttention(heads={self.heads}, kv_heads={self.kv_heads}, tp={self.group.size}, "
                f"kv heads here {self.kv_index.tolist()} x{self.kv_replicas})")
