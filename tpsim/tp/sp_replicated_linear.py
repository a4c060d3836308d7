"""A replicated linear on sequence-parallel tokens: its weight gradient summed over TP (a MoE router's gate).

Under sequence parallelism each TP rank holds s/p positions; a linear whose weight every rank holds whole (the
router of a mixture of experts, Qwen2-MoE's shared-expert gate) sees only its rank's tokens, so its weight
gradient is a partial sum over the sequence, as SP's norms' are (``tpsim.tp.rmsnorm``):

    forward   y_r = x_r · W                                   no communication
    backward  dx_r = dy_r · Wᵀ;  dW = all_reduce(x_rᵀ · dy_r)  one all-reduce of W's size over TP

traced as scope = the layer's path, phase ``SP_GRAD_SYNC``; part of the weight gradient (W), so a deferred W
moves it too. Megatron-LM marks the router's weight ``sequence_parallel`` for the same all-reduce.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.nn.linear import Linear, LinearCache, linear_backward_weight
from tpsim.phases import SP_GRAD_SYNC


class SequenceParallelReplicatedLinear(Linear):
    """``Linear`` whose gradients are all-reduced over the TP ``group`` (module docstring)."""

    def __init__(self, linear: Linear, group: Group) -> None:
        w = linear.params["weight"]
        super().__init__(linear.in_features, linear.out_features, bias=linear.has_bias, weight=w, dtype=w.dtype,
                         bias_value=linear.params.get("bias"))
        self.group = group

    def add_weight_grads(self, dout: np.ndarray, cache: LinearCache) -> None:
        dw, db = linear_backward_weight(dout, cache)
        with self.group.tracer.region(scope=self.path, phase=SP_GRAD_SYNC):
            if db is None:
                self.grads["weight"] += self.group.all_reduce(dw)
            else:
                both = self.group.all_reduce(np.concatenate([dw.ravel(), db]))
                self.grads["weight"] += both[:dw.size].reshape(dw.shape)
                self.grads["bias"] += both[dw.size:]

    def __repr__(self) -> str:
        return f"SequenceParallelReplicatedLinear({self.in_features} -> {self.out_features}, tp={self.group.size})"
