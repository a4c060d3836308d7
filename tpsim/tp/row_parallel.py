"""RowParallelLinear — eq. (2) of the seed: [Y1 Y2]·[B1; B2] = Y1·B1 + Y2·B2.

The weight B: [in, out] is split by *rows*; rank i holds B_i: [in/p, out] and the slice Y_i of the input's
last dimension. Each rank's product is a partial sum of the answer; g adds them up:

    forward   input_is_parallel=False: y_i = scatter(y)       [..., in] -> [..., in/p]
              z = g(y_i·B_i) + b                              [..., in/p] -> [..., out]
    backward  g backward is the identity: dz reaches every rank whole
              db = Σ dz (replicated, identical on every rank), dB_i = y_iᵀ·dz, dy_i = dz·B_iᵀ
              input_is_parallel=False: dy = all_gather(dy_i)

The bias is added once, *after* the reduction — adding it inside each rank's partial sum would count it p
times. After a ColumnParallelLinear(gather_output=False) the input is already split the right way
(input_is_parallel=True), which is what saves the gather + split between the two layers.

Sequence parallelism (``sequence_parallel=True``, Korthikanti et al. 2022): ḡ replaces g — the partial sums
are reduce-scattered along the sequence instead of all-reduced, and the bias is added to the shard:

    forward   z_r = reduce_scatter(y_i·B_i) + b                [b, s, in/p] -> [b, s/p, out]
    backward  dz = all_gather(dz_r)                            [b, s/p, out] -> [b, s, out]
              db = Σ dz over *all* rows (complete on every rank: no extra all-reduce for the bias)
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.nn.linear import Linear, linear_backward, linear_forward
from tpsim.nn.module import Module, Partition
from tpsim.tp.mappings import ReduceFromTPRegion, ScatterToTPRegion
from tpsim.partition import shard_range
from tpsim.tp.sequence_parallel import ReduceScatterToSequenceParallelRegion


class RowParallelLinear(Module):
    """z = y·B + b with B split by input rows over the TP group; bias replicated."""

    def __init__(self, in_features: int, out_features: int, group: Group, *, bias: bool = True,
                 input_is_parallel: bool = False, rng: np.random.Generator | None = None, dtype=np.float64,
                 std: float = 0.02, master_weight: np.ndarray | None = None,
                 master_bias: np.ndarray | None = None, sequence_parallel: bool = False) -> None:
        super().__init__()
        if sequence_parallel and not input_is_parallel:  # Megatron asserts the same
            raise ValueError("RowParallelLinear(sequence_parallel=True) needs input_is_parallel=True")
        rows = shard_range(in_features, group.size, group.rank, "in_features")
        if master_weight is None:  # every rank draws the same master matrix, then keeps its rows
            master = Linear(in_features, out_features, bias=bias, rng=rng, dtype=dtype, std=std)
            master_weight, master_bias = master.params["weight"], master.params.get("bias")
        self.group, self.input_is_parallel = group, input_is_parallel
        self.sequence_parallel = sequence_parallel  # output [b, s/p, out] (ḡ) instead of replicated (g)
        self.in_features, self.out_features = in_features, out_features
        index = np.arange(rows.start, rows.stop)
        self.add_param("weight", master_weight[index], Partition(0, index, in_features))  # [in/p, out]
        if bias:
            self.add_param("bias", master_bias)  # [out], replicated: the same on every rank

    @classmethod
    def from_serial(cls, linear: Linear, group: Group, *, input_is_parallel: bool = False,
                    sequence_parallel: bool = False) -> "RowParallelLinear":
        w = linear.params["weight"]
        return cls(w.shape[0], w.shape[1], group, bias="bias" in linear.params, input_is_parallel=input_is_parallel,
                   master_weight=w, master_bias=linear.params.get("bias"), sequence_parallel=sequence_parallel)

    def forward(self, y: np.ndarray):
        with self.group.tracer.region(scope=self.path):
            if not self.input_is_parallel:
                y = ScatterToTPRegion.forward(y, self.group)
            partial = linear_forward(y, self.params["weight"], None)
            if self.sequence_parallel:  # ḡ: sum and keep this rank's s/p rows
                z = ReduceScatterToSequenceParallelRegion.forward(partial, self.group)
            else:
                z = ReduceFromTPRegion.forward(partial, self.group)
            if "bias" in self.params:
                z += self.params["bias"]  # once, after the reduction
        return z, y

    def backward(self, dz: np.ndarray, y: np.ndarray) -> np.ndarray:
        with self.group.tracer.region(scope=self.path):
            if self.sequence_parallel:  # ḡ backward: every rank needs dz of the whole sequence
                dz = ReduceScatterToSequenceParallelRegion.backward(dz, self.group)
            else:
                dz = ReduceFromTPRegion.backward(dz, self.group)
            dy, dw, _ = linear_backward(dz, y, self.params["weight"], has_bias=False)
            self.grads["weight"] += dw
            if "bias" in self.params:
                # under SP dz is the gathered whole sequence, so this sum is already complete on every rank
                self.grads["bias"] += dz.reshape(-1, dz.shape[-1]).sum(axis=0)
            if not self.input_is_parallel:
                dy = ScatterToTPRegion.backward(dy, self.group)
            return dy
