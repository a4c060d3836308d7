"""Self-attention split by heads — Megatron-LM's ParallelAttention (Shoeybi et al. 2019, §3 and Fig. 3b).

Heads are independent from q·kᵀ to probs·v, so each of the p ranks takes heads / p whole heads and runs the
serial core on them alone. The two linears around the core are the MLP's pair again:

    x [b, s, h] --f--> c_attn_i (column-parallel) -> qkv_i [b, s, 3h/p] = q_i | k_i | v_i
                       attention over this rank's heads_per_partition heads  -> ctx_i [b, s, h/p]
                       c_proj_i (row-parallel) -> partial [b, s, h] --g--> y [b, s, h]

Exactly one all-reduce of the [b, s, h] activation forward (g in c_proj) and one backward (f in c_attn). The
forward and backward are the serial layer's (``tpsim.nn.attention.MultiHeadAttention``) on this rank's heads.
Built with ``region=SP_REGION`` the input and output are sequence shards [b, s/p, h]: c_attn all-gathers the
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
from tpsim.nn.attention import SERIAL_CORE, AttentionCore, CausalSelfAttention, MultiHeadAttention
from tpsim.tp.column_parallel import ColumnParallelLinear
from tpsim.tp.regions import TP_REGION, Region
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


class ParallelSelfAttention(MultiHeadAttention):
    """Causal self-attention over ``heads / tp`` whole heads per rank: ``MultiHeadAttention``'s forward and
    backward on a column-parallel c_attn (whole heads) and a row-parallel c_proj, one region."""

    def __init__(self, c_attn: ColumnParallelLinear, c_proj: RowParallelLinear, heads: int, *,
                 attn_dropout: float = 0.0, core: AttentionCore = SERIAL_CORE) -> None:
        group = c_attn.group
        hidden = c_attn.in_features
        check_attention_sizes(hidden, heads, group.size)
        if c_attn.gather_output or not c_proj.input_is_parallel:
            raise ValueError("ParallelSelfAttention needs c_attn(gather_output=False) and "
                             "c_proj(input_is_parallel=True)")
        if c_attn.region is not c_proj.region:
            raise ValueError("ParallelSelfAttention needs c_attn and c_proj built with the same region")
        expected = head_columns(hidden, heads, group.size, group.rank)
        if not np.array_equal(c_attn.columns, expected):  # the layout trap, caught at construction
            raise ValueError("c_attn must hold the q, k and v columns of whole heads (columns=head_columns(...)), "
                             "not a contiguous block of the 3h columns")
        local = heads // group.size
        super().__init__(c_attn, c_proj, heads, attn_dropout=attn_dropout,
                         head_index=np.arange(group.rank * local, (group.rank + 1) * local),  # global numbers
                         core=core)
        self.group, self.region = group, c_attn.region

    @classmethod
    def from_serial(cls, attn: CausalSelfAttention, group: Group, *,
                    region: Region = TP_REGION, core: AttentionCore = SERIAL_CORE) -> "ParallelSelfAttention":
        """Shard a serial layer's master weights: whole heads of c_attn, the matching rows of c_proj; ``core``: the
        attention core it attends with (``tpsim.nn.attention``; CP's ``tpsim.cp.context.ContextParallel``).

        A fresh model: shard a fresh ``CausalSelfAttention(...)`` (same on every rank for the same ``rng`` seed).
        """
        check_attention_sizes(attn.hidden, attn.heads, group.size)
        columns = head_columns(attn.hidden, attn.heads, group.size, group.rank)
        return cls(ColumnParallelLinear.from_serial(attn.c_attn, group, gather_output=False, columns=columns,
                                                    region=region),
                   RowParallelLinear.from_serial(attn.c_proj, group, input_is_parallel=True, region=region),
                   attn.heads, attn_dropout=attn.attn_dropout, core=core)

    def sequence_length(self, x: np.ndarray) -> int:
        """The whole sequence: ``x``'s under f, p times the shard's under f̄ (the core sees all of it)."""
        return self.region.sequence_length(x.shape[1], self.group)

    def __repr__(self) -> str:
        return (f"ParallelSelfAttention(hidden={self.hidden}, heads={self.heads}, "
                f"heads_per_partition={self.heads_per_partition}, tp={self.group.size})")
