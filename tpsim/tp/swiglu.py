"""Llama's SwiGLU MLP under TP: gate and up column-parallel with *matching* columns, down row-parallel.

    x [b, s, h] --f--> gate_i, up_i [b, s, ffn/p] --silu(gate_i) ⊙ up_i--> [b, s, ffn/p] --down_i--> partial --g-->

silu(g) ⊙ u pairs column j of gate with column j of up, and it is elementwise: a rank holding the *same*
columns j of both computes its slice of the product with no communication (the MLP argument of Shoeybi et al.
2019, §3, with a gated activation, Shazeer 2020, arXiv:2002.05202). One all-reduce forward (g in down_proj)
and one backward (f, shared by gate and up: ``tpsim.tp.shared_input``).

**The layout trap.** Checkpoints and kernels often fuse the two into one weight [h, 2·ffn] = [gate | up].
Split contiguously over p ranks, rank 0 of 2 gets all of gate and rank 1 all of up — rank 0 would multiply
silu(gate) by more gate columns, with no error raised. Each rank must take its columns of gate *and* the same
columns of up: ``gate_up_columns`` (the qkv trap of lesson 05 again; ``tpsim.tp.attention.head_columns``).
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.nn.module import Module
from tpsim.nn.swiglu import SwiGLU, SwiGLUCache, swiglu_product, swiglu_product_backward
from tpsim.partition import shard_range
from tpsim.tp.column_parallel import ColumnParallelLinear
from tpsim.tp.row_parallel import RowParallelLinear
from tpsim.tp.shared_input import shared_input_backward, shared_input_forward


def gate_up_columns(intermediate: int, tp: int, tp_rank: int) -> np.ndarray:
    """Columns of a fused [gate | up] weight [h, 2·ffn] that rank ``tp_rank`` must hold: its gate, same up."""
    mine = np.arange(intermediate)[shard_range(intermediate, tp, tp_rank, "intermediate_size")]
    return np.concatenate([mine, intermediate + mine])


class ParallelSwiGLU(Module):
    """``gate_proj, up_proj: [h, ffn/p]`` (the same master columns), ``down_proj: [ffn/p, h]``."""

    def __init__(self, gate_proj: ColumnParallelLinear, up_proj: ColumnParallelLinear,
                 down_proj: RowParallelLinear) -> None:
        super().__init__()
        if not np.array_equal(gate_proj.columns, up_proj.columns):  # the layout trap, caught at construction
            raise ValueError("gate_proj and up_proj must hold the same master columns (see gate_up_columns)")
        if not np.array_equal(gate_proj.columns, down_proj.rows):
            raise ValueError("down_proj must hold the rows matching gate/up's columns")
        self.group, self.sequence_parallel = gate_proj.group, gate_proj.sequence_parallel
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj

    @classmethod
    def from_serial(cls, mlp: SwiGLU, group: Group, *, sequence_parallel: bool = False) -> "ParallelSwiGLU":
        """Shard a serial SwiGLU: the same contiguous columns of gate and up, the matching rows of down."""
        sp = sequence_parallel
        gate, up = (ColumnParallelLinear.from_serial(lin, group, gather_output=False, sequence_parallel=sp)
                    for lin in (mlp.gate_proj, mlp.up_proj))
        down = RowParallelLinear.from_serial(mlp.down_proj, group, input_is_parallel=True, sequence_parallel=sp)
        return cls(gate, up, down)

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, SwiGLUCache]:
        """``x: [..., h]`` replicated (SP: ``[b, s/p, h]``) -> ``(z shaped as x, cache)``."""
        weights = [self.gate_proj.params["weight"], self.up_proj.params["weight"]]
        with self.group.tracer.region(scope=self.path):
            (g, u), (c_gate, c_up) = shared_input_forward(x, weights, self.group, self.sequence_parallel)
        m, c_silu, a = swiglu_product(g, u)  # elementwise on matching columns: no communication
        z, c_down = self.down_proj.forward(m)  # g: all-reduce (SP: ḡ reduce-scatter)
        return z, SwiGLUCache(c_gate, c_up, c_silu, u, a, c_down)

    def backward(self, dz: np.ndarray, cache: SwiGLUCache) -> np.ndarray:
        """``dz`` shaped as the output -> ``dx`` shaped as the input (one f all-reduce for gate and up)."""
        dg, du = swiglu_product_backward(self.down_proj.backward(dz, cache.down_proj), cache)
        with self.group.tracer.region(scope=self.path):
            dx, (dw_gate, dw_up) = shared_input_backward([dg, du], [cache.gate_proj, cache.up_proj], self.group,
                                                         self.sequence_parallel)
        self.gate_proj.grads["weight"] += dw_gate
        self.up_proj.grads["weight"] += dw_up
        return dx
