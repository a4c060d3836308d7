"""Llama's SwiGLU MLP under TP: gate and up column-parallel with *matching* columns, down row-parallel.

    x [b, s, h] --f--> gate_i, up_i [b, s, ffn/p] --silu(gate_i) ⊙ up_i--> [b, s, ffn/p] --down_i--> partial --g-->

silu(g) ⊙ u pairs column j of gate with column j of up, and it is elementwise: a rank holding the *same*
columns j of both computes its slice of the product with no communication (the MLP argument of Shoeybi et al.
2019, §3, with a gated activation, Shazeer 2020, arXiv:2002.05202). One all-reduce forward (g in down_proj)
and one backward (f, shared by gate and up: one ``MultiOutputColumnParallelLinear``). The forward and backward
are the serial layer's (``tpsim.nn.swiglu.GatedMLP``).

**The layout trap.** Checkpoints and kernels often fuse the two into one weight [h, 2·ffn] = [gate | up].
Split contiguously over p ranks, rank 0 of 2 gets all of gate and rank 1 all of up — rank 0 would multiply
silu(gate) by more gate columns, with no error raised. Each rank must take its columns of gate *and* the same
columns of up: ``gate_up_columns`` (the qkv trap of lesson 05 again; ``tpsim.tp.attention.head_columns``).
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.nn.swiglu import GatedMLP, SwiGLU
from tpsim.partition import shard_range
from tpsim.tp.multi_output_column_parallel import MultiOutputColumnParallelLinear
from tpsim.tp.regions import TP_REGION, Region
from tpsim.tp.row_parallel import RowParallelLinear


def gate_up_columns(intermediate: int, tp: int, tp_rank: int) -> np.ndarray:
    """Columns of a fused [gate | up] weight [h, 2·ffn] that rank ``tp_rank`` must hold: its gate, same up."""
    mine = np.arange(intermediate)[shard_range(intermediate, tp, tp_rank, "intermediate_size")]
    return np.concatenate([mine, intermediate + mine])


class ParallelSwiGLU(GatedMLP):
    """``gate_proj, up_proj: [h, ffn/p]`` (the same master columns, one multi-output layer), ``down_proj: [ffn/p, h]``;
    ``GatedMLP``'s forward and backward."""

    def __init__(self, gate_up: MultiOutputColumnParallelLinear, down_proj: RowParallelLinear) -> None:
        gate, up = gate_up.gate_proj, gate_up.up_proj
        if not np.array_equal(gate.columns, up.columns):  # the layout trap, caught at construction
            raise ValueError("gate_proj and up_proj must hold the same master columns (see gate_up_columns)")
        if not np.array_equal(gate.columns, down_proj.rows):
            raise ValueError("down_proj must hold the rows matching gate/up's columns")
        if gate_up.region is not down_proj.region or not down_proj.input_is_parallel:
            raise ValueError("ParallelSwiGLU needs down_proj(input_is_parallel=True) built with gate_up's region")
        super().__init__(gate_up, down_proj)
        self.group = gate_up.group

    @classmethod
    def from_serial(cls, mlp: SwiGLU, group: Group, *, region: Region = TP_REGION) -> "ParallelSwiGLU":
        """Shard a serial SwiGLU: the same contiguous columns of gate and up, the matching rows of down."""
        gate_up = MultiOutputColumnParallelLinear.from_serial(mlp.gate_up, group, region=region)
        return cls(gate_up, RowParallelLinear.from_serial(mlp.down_proj, group, input_is_parallel=True, region=region))
