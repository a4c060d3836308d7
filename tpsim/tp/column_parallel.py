"""ColumnParallelLinear — the SenseParrots article, eq. (1): X·[A1 A2] = [X·A1  X·A2].

The weight A: [in, out] is split by *columns*; rank i holds A_i: [in, out/p] (and bias b_i: [out/p]) and
computes its own slice of the output with no communication at all:

    forward   x --f--> x·A_i + b_i = y_i                      [..., in] -> [..., out/p]
              gather_output=True: y = all_gather(y_i)         [..., out/p] -> [..., out]
    backward  dA_i = xᵀ·dy_i,  db_i = Σ dy_i,  dx_i = dy_i·A_iᵀ (a partial sum)
              f backward: dx = all_reduce(dx_i)               (x fed every shard, so its grads add up)

Sequence parallelism (built with ``region=SP_REGION``, Korthikanti et al. 2022): the input arrives split along
the sequence and f̄ replaces f — all-gather in, reduce-scatter out (``tpsim.tp.regions``):

    forward   x_r [b, s/p, in] --f̄ all-gather--> x [b, s, in] --> y_i = x·A_i + b_i      (cache: x_r, not x)
    backward  x = all_gather(x_r) again; dA_i = xᵀ·dy_i;  dx_r = reduce_scatter(dy_i·A_iᵀ)   [b, s/p, in]

The backward's two halves (``Module.weight_grad``; the zero-bubble pipeline runs them apart): the input
gradient with f's all-reduce (f̄'s reduce-scatter), and the weight gradient with the all-gather that rebuilds
x under SP — so a deferred W issues that all-gather itself, and B does not need x at all.

``column_parallel_forward``/``_backward`` are that arithmetic on given shards; the tied LM head
(``tpsim.tp.lm_head``) runs the same two on the embedding's shard, transposed.

Built from the serial layer's master weights (``from_serial``, or a fresh draw by the serial ``Linear`` with
the same keywords) the TP result equals the serial one at any TP size. ``columns`` lets a caller choose
*which* master columns a rank holds — attention uses it so each rank's qkv shard holds the q, k and v of
whole heads; the InsightFace classifier uses it for uneven class slices. ``replica`` numbers a shard that
several ranks hold alike (a grouped-query KV head replicated over TP ranks): only copy 0 counts in a norm.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.kinds import MATMUL_MARK
from tpsim.nn.linear import Linear, LinearCache, linear_backward_weight
from tpsim.nn.module import Module
from tpsim.partition import Partition, shard_range, take_shard
from tpsim.tp.mappings import GatherFromTPRegion
from tpsim.tp.regions import TP_REGION, Region


def shard_index(n: int, group: Group, index, what: str) -> np.ndarray:
    """The master positions this rank holds along a split dimension: ``index``, or its contiguous n/p."""
    return np.arange(n)[shard_range(n, group.size, group.rank, what)] if index is None else np.asarray(index)


def serial_keywords(linear: Linear) -> dict:
    """The ``Linear`` keywords that rebuild ``linear``'s master weights: how ``from_serial`` feeds ``__init__``."""
    w = linear.params["weight"]
    return dict(bias=linear.has_bias, dtype=w.dtype, weight=w, bias_value=linear.params.get("bias"))


def column_parallel_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, group: Group,
                            region: Region) -> tuple[np.ndarray, LinearCache]:
    """f (or f̄), then ``y_i = x·w + b``: ``x [..., in]`` (SP: ``[b, s/p, in]``), ``w [in, out/p]`` -> ``[..., out/p]``.

    The cache keeps ``x`` as it arrived: under SP the shard, not f̄'s gathered output.
    """
    (y,) = region.enter_matmul(x, [w], group)  # under SP per sequence chunk (tpsim.tp.collective_matmul)
    if b is not None:
        with MATMUL_MARK:  # the bias add rides along with its GEMM (tpsim.kinds)
            y += b  # y is a fresh array
    return y, LinearCache(x, w, b is not None)


def column_parallel_backward(dy: np.ndarray, cache: LinearCache, group: Group,
                             region: Region) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``dy [..., out/p]`` -> ``(dx [..., in] summed over ranks (SP: [b, s/p, in]), dw [in, out/p], db)``."""
    dw, db = column_parallel_backward_weight(dy, cache, group, region)  # SP: the re-gather first, as before
    return column_parallel_backward_input(dy, cache, group, region), dw, db


def column_parallel_backward_input(dy: np.ndarray, cache: LinearCache, group: Group, region: Region) -> np.ndarray:
    """B alone: ``dy [..., out/p]`` -> ``dx [..., in]`` summed over ranks (SP: ``[b, s/p, in]``); x is not read."""
    return region.matmul_enter_backward([dy], [cache.w], group)


def column_parallel_backward_weight(dy: np.ndarray, cache: LinearCache, group: Group,
                                    region: Region) -> tuple[np.ndarray, np.ndarray | None]:
    """W alone: ``dy [..., out/p]`` -> ``(dw [in, out/p], db)``; under SP x is all-gathered again here."""
    return linear_backward_weight(dy, cache._replace(x=region.regather(cache.x, group)))


class ColumnParallelLinear(Module):
    """y = x·A + b with A split by output columns over the TP group.

    Keywords after the layout ones are the serial ``Linear``'s: the master weights are drawn (or, given as
    ``weight``/``bias_value``, checked) by ``Linear`` itself, so every rank holds a slice of the same master.
    """

    def __init__(self, in_features: int, out_features: int, group: Group, *, gather_output: bool = True,
                 columns: np.ndarray | None = None, region: Region = TP_REGION, replica: int = 0,
                 bias: bool = True, rng: np.random.Generator | None = None, dtype=np.float64, std: float = 0.02,
                 weight: np.ndarray | None = None, bias_value: np.ndarray | None = None) -> None:
        super().__init__()
        if columns is not None and gather_output:
            raise ValueError("gather_output=True needs the default contiguous column split")
        master = Linear(in_features, out_features, bias=bias, rng=rng, dtype=dtype, std=std, weight=weight,
                        bias_value=bias_value)
        self.group, self.gather_output = group, gather_output
        self.region = region  # input replicated [..., in] (f) or [b, s/p, in] (f̄)
        self.in_features, self.out_features = in_features, out_features
        self.columns = shard_index(out_features, group, columns, "out_features")
        for name, dim in (("weight", 1), ("bias", 0)):
            if name in master.params:
                part = Partition(dim, self.columns, out_features, replica=replica)
                self.add_param(name, take_shard(master.params[name], part), part)  # [in, out/p], [out/p]

    @classmethod
    def from_serial(cls, linear: Linear, group: Group, *, gather_output: bool = True,
                    columns: np.ndarray | None = None, region: Region = TP_REGION,
                    replica: int = 0) -> "ColumnParallelLinear":
        """This rank's columns of the serial layer's master weights."""
        return cls(linear.in_features, linear.out_features, group, gather_output=gather_output, columns=columns,
                   region=region, replica=replica, **serial_keywords(linear))

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, LinearCache]:
        """``x: [..., in]`` replicated (SP: ``[b, s/p, in]``) -> ``(y [..., out/p] or gathered [..., out], cache)``."""
        with self.group.tracer.region(scope=self.path):
            y, cache = column_parallel_forward(x, self.params["weight"], self.params.get("bias"), self.group,
                                               self.region)
            if self.gather_output:
                y = GatherFromTPRegion.forward(y, self.group)
        return y, cache

    def backward(self, dy: np.ndarray, cache: LinearCache) -> np.ndarray:
        """``dy`` shaped as the output -> ``dx`` shaped as the input; adds into this rank's shards' grads."""
        with self.group.tracer.region(scope=self.path):
            if self.gather_output:
                dy = GatherFromTPRegion.backward(dy, self.group)
            self.weight_grad(self.add_weight_grads, dy, cache)  # W first: SP's all-gather, then f̄'s reduce-scatter
            return column_parallel_backward_input(dy, cache, self.group, self.region)

    def add_weight_grads(self, dy: np.ndarray, cache: LinearCache) -> None:
        """W: ``dA_i += xᵀ·dy`` (and ``db_i``), x all-gathered again under SP; traced under this layer's path."""
        with self.group.tracer.region(scope=self.path):
            self.add_grads(*column_parallel_backward_weight(dy, cache, self.group, self.region))

    def add_grads(self, dw: np.ndarray, db: np.ndarray | None) -> None:
        """Add a backward's ``dw [in, out/p]`` (and ``db [out/p]``) into this shard's gradients."""
        self.grads["weight"] += dw
        if db is not None:
            self.grads["bias"] += db
