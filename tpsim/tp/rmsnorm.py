"""RMSNorm under sequence parallelism: replicated weight, gradient all-reduced (as ``SequenceParallelLayerNorm``).

Under plain TP, RMSNorm is replicated and needs nothing (every rank normalises the whole [b, s, h]). Under SP
each rank normalises its s/p positions, so its weight gradient is a partial sum over the sequence:

    forward   y_r = RMSNorm(x_r)                            [b, s/p, h] -> [b, s/p, h]   (no communication)
    backward  dx_r as serial;  dw = all_reduce(Σ_{rows of r} dy·x̂)                        one [h] all-reduce

traced as scope = the norm's path, phase ``SP_GRAD_SYNC`` (Korthikanti et al. 2022, arXiv:2205.05198, §4.2.2).
The all-reduce is part of the weight gradient (W, ``Module.weight_grad``): deferred, it moves with it.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.nn.rmsnorm import RMSNorm, RMSNormCache, rmsnorm_backward_weight
from tpsim.phases import SP_GRAD_SYNC


class SequenceParallelRMSNorm(RMSNorm):
    """RMSNorm over this rank's sequence shard; ``weight: [h]`` replicated, its gradient all-reduced over TP."""

    def __init__(self, features: int, group: Group, *, eps: float = 1e-6, dtype=np.float64) -> None:
        super().__init__(features, eps=eps, dtype=dtype)
        self.group = group

    @classmethod
    def from_serial(cls, norm: RMSNorm, group: Group) -> "SequenceParallelRMSNorm":
        """A copy of ``norm``'s weight (a replica, never an alias of the master)."""
        out = cls(norm.features, group, eps=norm.eps, dtype=norm.params["weight"].dtype)
        out.params["weight"][...] = norm.params["weight"]
        return out

    def add_weight_grads(self, dout: np.ndarray, cache: RMSNormCache) -> None:
        """W (``backward`` is RMSNorm's): ``grads["weight"] += all_reduce(Σ_{rows of r} dy·x̂)``."""
        dw = rmsnorm_backward_weight(dout, cache)
        with self.group.tracer.region(scope=self.path, phase=SP_GRAD_SYNC):
            self.grads["weight"] += self.group.all_reduce(dw)

    def __repr__(self) -> str:
        return f"SequenceParallelRMSNorm({self.features}, eps={self.eps}, tp={self.group.size})"
