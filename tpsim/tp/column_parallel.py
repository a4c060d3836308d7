"""ColumnParallelLinear — eq. (1) of the seed: X·[A1 A2] = [X·A1  X·A2].

The weight A: [in, out] is split by *columns*; rank i holds A_i: [in, out/p] (and bias b_i: [out/p]) and
computes its own slice of the output with no communication at all:

    forward   x --f--> x·A_i + b_i = y_i                      [..., in] -> [..., out/p]
              gather_output=True: y = all_gather(y_i)         [..., out/p] -> [..., out]
    backward  dA_i = xᵀ·dy_i,  db_i = Σ dy_i,  dx_i = dy_i·A_iᵀ (a partial sum)
              f backward: dx = all_reduce(dx_i)               (x fed every shard, so its grads add up)

Sequence parallelism (``sequence_parallel=True``, Korthikanti et al. 2022): the input arrives split along the
sequence and f̄ replaces f — all-gather in, reduce-scatter out (``tpsim.tp.sequence_parallel``):

    forward   x_r [b, s/p, in] --f̄ all-gather--> x [b, s, in] --> y_i = x·A_i + b_i      (cache: x_r, not x)
    backward  x = all_gather(x_r) again; dA_i = xᵀ·dy_i;  dx_r = reduce_scatter(dy_i·A_iᵀ)   [b, s/p, in]

Built from the serial layer's master weights (``from_serial``) the TP result equals the serial one at any
TP size. ``columns`` lets a caller choose *which* master columns a rank holds — attention uses it so each
rank's qkv shard holds the q, k and v of whole heads.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.nn.linear import Linear, linear_backward, linear_forward
from tpsim.nn.module import Module, Partition
from tpsim.tp.mappings import CopyToTPRegion, GatherFromTPRegion
from tpsim.partition import shard_range
from tpsim.tp.sequence_parallel import GatherFromSequenceParallelRegion, regather_sequence


class ColumnParallelLinear(Module):
    """y = x·A + b with A split by output columns over the TP group."""

    def __init__(self, in_features: int, out_features: int, group: Group, *, bias: bool = True,
                 gather_output: bool = True, rng: np.random.Generator | None = None, dtype=np.float64,
                 std: float = 0.02, master_weight: np.ndarray | None = None, master_bias: np.ndarray | None = None,
                 columns: np.ndarray | None = None, sequence_parallel: bool = False) -> None:
        super().__init__()
        if columns is None:
            columns = np.arange(out_features)[shard_range(out_features, group.size, group.rank, "out_features")]
        elif gather_output:
            raise ValueError("gather_output=True needs the default contiguous column split")
        if master_weight is None:  # every rank draws the same master matrix, then keeps its columns
            master = Linear(in_features, out_features, bias=bias, rng=rng, dtype=dtype, std=std)
            master_weight, master_bias = master.params["weight"], master.params.get("bias")
        self.group, self.gather_output = group, gather_output
        self.sequence_parallel = sequence_parallel  # input [b, s/p, in] (f̄) instead of replicated [..., in] (f)
        self.in_features, self.out_features = in_features, out_features
        self.columns = np.asarray(columns)
        self.add_param("weight", master_weight[:, self.columns], Partition(1, self.columns, out_features))  # [in, out/p]
        if bias:
            self.add_param("bias", master_bias[self.columns], Partition(0, self.columns, out_features))  # [out/p]

    @classmethod
    def from_serial(cls, linear: Linear, group: Group, *, gather_output: bool = True,
                    columns: np.ndarray | None = None, sequence_parallel: bool = False) -> "ColumnParallelLinear":
        w = linear.params["weight"]
        return cls(w.shape[0], w.shape[1], group, bias="bias" in linear.params, gather_output=gather_output,
                   master_weight=w, master_bias=linear.params.get("bias"), columns=columns,
                   sequence_parallel=sequence_parallel)

    def forward(self, x: np.ndarray):
        with self.group.tracer.region(scope=self.path):
            if self.sequence_parallel:  # f̄; only the shard is kept for backward (it is gathered again there)
                shard, x = x, GatherFromSequenceParallelRegion.forward(x, self.group)
            else:
                x = CopyToTPRegion.forward(x, self.group)
            y = linear_forward(x, self.params["weight"], self.params.get("bias"))
            if self.gather_output:
                y = GatherFromTPRegion.forward(y, self.group)
        return y, (shard if self.sequence_parallel else x)

    def backward(self, dy: np.ndarray, x: np.ndarray) -> np.ndarray:
        with self.group.tracer.region(scope=self.path):
            if self.gather_output:
                dy = GatherFromTPRegion.backward(dy, self.group)
            if self.sequence_parallel:  # the cache is this rank's [b, s/p, in]; dA_i needs all of x
                x = regather_sequence(x, self.group)
            dx, dw, db = linear_backward(dy, x, self.params["weight"], has_bias="bias" in self.params)
            self.grads["weight"] += dw
            if "bias" in self.params:
                self.grads["bias"] += db
            if self.sequence_parallel:  # f̄ backward: sum the partial dx over ranks, keep this rank's s/p rows
                return GatherFromSequenceParallelRegion.backward(dx, self.group)
            return CopyToTPRegion.backward(dx, self.group)
