"""The parallel squared-ReLU MLP (Nemotron-4): column-parallel up_proj → relu² → row-parallel down_proj.

    x [t, h] --f--> up_proj_i [t, F/p] --relu²--> [t, F/p] --down_proj_i--> partial [t, h] --g--> z [t, h]

Megatron's MLP split (Shoeybi et al. 2019, Fig. 3a) with the elementwise relu² in place of GeLU: one
all-reduce forward (g in down_proj) and one backward (f in up_proj); with ``region=SP_REGION`` f̄ and ḡ (the
all-gather and the reduce-scatter of the sequence) replace them. There is no gate, so no pairing of columns to
keep (SwiGLU's ``tpsim.tp.swiglu`` has one). The forward and backward are the serial ``Relu2MLP``'s.
"""

from __future__ import annotations

from tpsim.comm import Group
from tpsim.nn.relu2 import Relu2MLP
from tpsim.tp.column_parallel import ColumnParallelLinear
from tpsim.tp.regions import TP_REGION, Region
from tpsim.tp.row_parallel import RowParallelLinear


class ParallelRelu2MLP(Relu2MLP):
    """``up_proj: [h, F/p]`` column-parallel (not gathered), ``down_proj: [F/p, h]`` row-parallel, one region."""

    def __init__(self, up_proj: ColumnParallelLinear, down_proj: RowParallelLinear) -> None:
        if up_proj.gather_output or not down_proj.input_is_parallel:
            raise ValueError("ParallelRelu2MLP needs up_proj(gather_output=False) and "
                             "down_proj(input_is_parallel=True)")
        if up_proj.region is not down_proj.region:
            raise ValueError("ParallelRelu2MLP needs up_proj and down_proj built with the same region")
        super().__init__(up_proj, down_proj)

    @classmethod
    def from_serial(cls, mlp: Relu2MLP, group: Group, *, region: Region = TP_REGION) -> "ParallelRelu2MLP":
        """Shard a serial MLP's master weights: up_proj by columns, down_proj by rows."""
        return cls(ColumnParallelLinear.from_serial(mlp.up_proj, group, gather_output=False, region=region),
                   RowParallelLinear.from_serial(mlp.down_proj, group, input_is_parallel=True, region=region))

    def __repr__(self) -> str:
        return f"ParallelRelu2MLP(tp={self.up_proj.group.size})"
