"""RowParallelLinear — the SenseParrots article, eq. (2): [Y1 Y2]·[B1; B2] = Y1·B1 + Y2·B2.

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

Sequence parallelism (built with ``region=SP_REGION``, Korthikanti et al. 2022): ḡ replaces g — the partial
sums are reduce-scattered along the sequence instead of all-reduced, and the bias is added to the shard:

    forward   z_r = reduce_scatter(y_i·B_i) + b                [b, s, in/p] -> [b, s/p, out]
    backward  dz = all_gather(dz_r)                            [b, s/p, out] -> [b, s, out]
              db = Σ dz over *all* rows (complete on every rank: no extra all-reduce for the bias)

g and ḡ are the region's (``tpsim.tp.regions``), chosen at construction; the constructor mirrors ``ColumnParallelLinear``'s (``rows=`` for
``columns=``, the serial ``Linear``'s keywords for the master weights).
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.nn.linear import Linear, LinearCache, linear_backward_weight
from tpsim.nn.module import Module
from tpsim.nn.precision import row_sum
from tpsim.partition import Partition, take_shard
from tpsim.tp.column_parallel import serial_keywords, shard_index
from tpsim.tp.mappings import ScatterToTPRegion
from tpsim.tp.regions import TP_REGION, Region


class RowParallelLinear(Module):
    """z = y·B + b with B split by input rows over the TP group; bias replicated. Built as ``ColumnParallelLinear``."""

    def __init__(self, in_features: int, out_features: int, group: Group, *, input_is_parallel: bool = False,
                 rows: np.ndarray | None = None, region: Region = TP_REGION, bias: bool = True,
                 rng: np.random.Generator | None = None, dtype=np.float64, std: float = 0.02,
                 weight: np.ndarray | None = None, bias_value: np.ndarray | None = None) -> None:
        super().__init__()
        if region.splits_sequence and not input_is_parallel:  # Megatron asserts the same
            raise ValueError("RowParallelLinear(region=SP_REGION) needs input_is_parallel=True")
        if rows is not None and not input_is_parallel:
            raise ValueError("input_is_parallel=False needs the default contiguous row split")
        master = Linear(in_features, out_features, bias=bias, rng=rng, dtype=dtype, std=std, weight=weight,
                        bias_value=bias_value)
        self.group, self.input_is_parallel = group, input_is_parallel
        self.region = region  # output replicated [..., out] (g) or [b, s/p, out] (ḡ)
        self.in_features, self.out_features = in_features, out_features
        self.rows = shard_index(in_features, group, rows, "in_features")
        part = Partition(0, self.rows, in_features)
        self.add_param("weight", take_shard(master.params["weight"], part), part)  # [in/p, out]
        if bias:
            self.add_param("bias", master.params["bias"])  # [out], replicated: the same on every rank

    @classmethod
    def from_serial(cls, linear: Linear, group: Group, *, input_is_parallel: bool = False,
                    rows: np.ndarray | None = None, region: Region = TP_REGION) -> "RowParallelLinear":
        """This rank's rows of the serial layer's master weight (and the whole bias)."""
        return cls(linear.in_features, linear.out_features, group, input_is_parallel=input_is_parallel, rows=rows,
                   region=region, **serial_keywords(linear))

    def forward(self, y: np.ndarray) -> tuple[np.ndarray, LinearCache]:
        """``y: [..., in/p]`` (or ``[..., in]`` to be split here) -> ``(z [..., out] (SP: [b, s/p, out]), cache)``."""
        with self.group.tracer.region(scope=self.path):
            if not self.input_is_parallel:
                y = ScatterToTPRegion.forward(y, self.group)
            w = self.params["weight"]
            z = self.region.matmul_leave(y, w, self.group)  # y·B, then g: all-reduce; ḡ: reduce-scatter
            cache = LinearCache(y, w, False)
            if "bias" in self.params:
                z += self.params["bias"]  # once, after the reduction
        return z, cache

    def backward(self, dz: np.ndarray, cache: LinearCache) -> np.ndarray:
        """``dz`` shaped as the output -> ``dy`` shaped as the input; adds into the weight shard and the bias."""
        with self.group.tracer.region(scope=self.path):
            dz, dy = self.region.leave_backward_matmul(dz, cache.w, self.group)  # ḡ: the whole sequence's dz
            self.weight_grad(self.add_weight_grads, dz, cache)
            if not self.input_is_parallel:
                dy = ScatterToTPRegion.backward(dy, self.group)
            return dy

    def add_weight_grads(self, dz: np.ndarray, cache: LinearCache) -> None:
        """W: ``dB_i += y_iᵀ·dz`` and the bias's ``Σ dz`` (dz whole on every rank; no communication)."""
        dw, _ = linear_backward_weight(dz, cache)
        self.grads["weight"] += dw
        if "bias" in self.params:
            # under SP dz is the gathered whole sequence, so this sum is already complete on every rank
            self.grads["bias"] += row_sum(dz.reshape(-1, dz.shape[-1]))
