"""The parallel MLP of Megatron-LM: column-parallel c_fc → GeLU → row-parallel c_proj (Shoeybi et al. 2019, Fig. 3a).

    x [t, h] --f--> c_fc_i [t, ffn/p] --GeLU--> [t, ffn/p] --c_proj_i--> partial [t, h] --g--> z [t, h]

GeLU is non-linear, so GeLU(X·A1 + X·A2) ≠ GeLU(X·A1) + GeLU(X·A2): splitting A by *rows* would force a
synchronisation before the GeLU. Splitting A by *columns* instead lets each rank apply GeLU to its own slice,
and B split by rows consumes that slice directly — the gather "waits" until g at the very end. Result: exactly
one all-reduce of the [tokens, hidden] activation forward (g in c_proj) and one backward (f in c_fc).

With ``sequence_parallel=True`` the block's input and output are sequence shards [b, s/p, h]: f̄ (all-gather)
in c_fc and ḡ (reduce-scatter) in c_proj replace f and g — see ``tpsim.tp.sequence_parallel``.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.nn.activations import gelu_backward, gelu_forward
from tpsim.nn.mlp import MLP, MLPCache
from tpsim.nn.module import Module
from tpsim.tp.column_parallel import ColumnParallelLinear
from tpsim.tp.row_parallel import RowParallelLinear


class ParallelMLP(Module):
    def __init__(self, c_fc: ColumnParallelLinear, c_proj: RowParallelLinear, approximate: str = "tanh") -> None:
        super().__init__()
        if c_fc.gather_output or not c_proj.input_is_parallel:
            raise ValueError("ParallelMLP needs c_fc(gather_output=False) and c_proj(input_is_parallel=True)")
        if c_fc.sequence_parallel != c_proj.sequence_parallel:
            raise ValueError("ParallelMLP needs c_fc and c_proj both sequence-parallel or both not")
        self.sequence_parallel = c_fc.sequence_parallel
        self.c_fc, self.c_proj, self.approximate = c_fc, c_proj, approximate

    @classmethod
    def from_serial(cls, mlp: MLP, group: Group, *, sequence_parallel: bool = False) -> "ParallelMLP":
        """Shard a serial MLP's master weights: c_fc by columns, c_proj by rows (a fresh model: shard ``MLP(...)``)."""
        sp = sequence_parallel
        return cls(ColumnParallelLinear.from_serial(mlp.c_fc, group, gather_output=False, sequence_parallel=sp),
                   RowParallelLinear.from_serial(mlp.c_proj, group, input_is_parallel=True, sequence_parallel=sp),
                   mlp.approximate)

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, MLPCache]:
        """``x: [..., h]`` replicated (SP: ``[b, s/p, h]``) -> ``(z, cache)``, ``z`` shaped as ``x``."""
        h, c_fc = self.c_fc.forward(x)  # [..., ffn/p], no communication
        a, gelu = gelu_forward(h, self.approximate)  # element-wise: fine on a column slice
        z, c_proj = self.c_proj.forward(a)  # partial sums, all-reduced by g
        return z, MLPCache(c_fc, gelu, c_proj)

    def backward(self, dz: np.ndarray, cache: MLPCache) -> np.ndarray:
        """``dz`` shaped as the output -> ``dx`` shaped as the input (f's all-reduce happens in c_fc)."""
        da = self.c_proj.backward(dz, cache.c_proj)
        dh = gelu_backward(da, cache.gelu)
        return self.c_fc.backward(dh, cache.c_fc)
