"""The parallel MLP of Megatron-LM: column-parallel c_fc → GeLU → row-parallel c_proj (Shoeybi et al. 2019, Fig. 3a).

    x [t, h] --f--> c_fc_i [t, ffn/p] --GeLU--> [t, ffn/p] --c_proj_i--> partial [t, h] --g--> z [t, h]

GeLU is non-linear, so GeLU(X·A1 + X·A2) ≠ GeLU(X·A1) + GeLU(X·A2): splitting A by *rows* would force a
synchronisation before the GeLU. Splitting A by *columns* instead lets each rank apply GeLU to its own slice,
and B split by rows consumes that slice directly — the gather "waits" until g at the very end. Result: exactly
one all-reduce of the [tokens, hidden] activation forward (g in c_proj) and one backward (f in c_fc).

The forward and backward are the serial MLP's (``tpsim.nn.mlp.GeluMLP``): only the two linears differ. Built
with ``region=SP_REGION`` the block's input and output are sequence shards [b, s/p, h]: f̄ (all-gather) in c_fc
and ḡ (reduce-scatter) in c_proj replace f and g — see ``tpsim.tp.regions``.
"""

from __future__ import annotations

from tpsim.comm import Group
from tpsim.nn.mlp import MLP, GeluMLP
from tpsim.tp.column_parallel import ColumnParallelLinear
from tpsim.tp.regions import TP_REGION, Region
from tpsim.tp.row_parallel import RowParallelLinear


class ParallelMLP(GeluMLP):
    """``c_fc: [h, ffn/p]`` column-parallel (not gathered), ``c_proj: [ffn/p, h]`` row-parallel, one region."""

    def __init__(self, c_fc: ColumnParallelLinear, c_proj: RowParallelLinear, approximate: str = "tanh") -> None:
        if c_fc.gather_output or not c_proj.input_is_parallel:
            raise ValueError("ParallelMLP needs c_fc(gather_output=False) and c_proj(input_is_parallel=True)")
        if c_fc.region is not c_proj.region:
            raise ValueError("ParallelMLP needs c_fc and c_proj built with the same region")
        super().__init__(c_fc, c_proj, approximate)

    @classmethod
    def from_serial(cls, mlp: MLP, group: Group, *, region: Region = TP_REGION) -> "ParallelMLP":
        """Shard a serial MLP's master weights: c_fc by columns, c_proj by rows (a fresh model: shard ``MLP(...)``)."""
        return cls(ColumnParallelLinear.from_serial(mlp.c_fc, group, gather_output=False, region=region),
                   RowParallelLinear.from_serial(mlp.c_proj, group, input_is_parallel=True, region=region),
                   mlp.approximate)
