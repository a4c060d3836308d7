"""The two layers that change *kind* under sequence parallelism: LayerNorm and the tied LM head.

**LayerNorm** (Korthikanti et al. 2022, §4.2.2). Its weight and bias stay replicated, but with SP each rank
normalises only its s/p positions, so its parameter gradients are partial sums over the sequence:

    forward   y_r = LN(x_r)                                 [b, s/p, h] -> [b, s/p, h]   (no communication)
    backward  dx_r as serial;  (dw, db) = all_reduce(Σ_{rows of r} (dy·x̂, dy))          one [2, h] all-reduce

The all-reduce is traced as scope = the LayerNorm's path (``transformer.h.0.ln_1``), phase ``sp_grad_sync``:
it is a gradient synchronisation of a replicated parameter, not an activation's operator, so a trace keeps it
apart from the forward/backward f̄/ḡ traffic. Only the *new* contribution is reduced, before it is added to
``grads`` — what ``grads`` held already (previous micro-batches, all ranks equal) must not be summed p times.
Megatron does the same sum once per step for all such parameters (``sequence_parallel`` attribute,
coalesced in ``finalize_model_grads``); per layer is the readable version of it.

The other replicated parameters whose input is a sequence shard need nothing: the row-parallel bias takes its
gradient from the all-gathered dz (``row_parallel.py``) and the position embedding is added before the
sequence is scattered (``tpsim.models.gpt``), so their gradients are already complete on every rank.

**LM head** (Megatron's output layer with ``sequence_parallel``): ln_f's output is a shard [b, s/p, h]; the
head gathers the sequence (f̄) before its vocab-parallel matmul, exactly like a column-parallel linear:

    forward   h = all_gather(h_r)  [b, s/p, h] -> [b, s, h];   logits_r = h·E_rᵀ  [b, s, Vp/p]
    backward  h = all_gather(h_r) again;  dE_r += dlogits_rᵀ·h;  dh_r = reduce_scatter(dlogits_r·E_r)
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.nn.layernorm import LayerNorm, layernorm_backward
from tpsim.nn.linear import linear_backward, linear_forward
from tpsim.tp.lm_head import ParallelLMHead
from tpsim.tp.sequence_parallel import GatherFromSequenceParallelRegion, regather_sequence

SP_GRAD_SYNC = "sp_grad_sync"  # trace phase of the replicated-parameter gradient all-reduces


class SequenceParallelLayerNorm(LayerNorm):
    """LayerNorm over this rank's sequence shard; ``weight, bias: [h]`` replicated, gradients all-reduced."""

    def __init__(self, features: int, group: Group, *, eps: float = 1e-5, dtype=np.float64) -> None:
        super().__init__(features, eps=eps, dtype=dtype)
        self.group = group

    @classmethod
    def from_serial(cls, ln: LayerNorm, group: Group) -> "SequenceParallelLayerNorm":
        """A copy of ``ln``'s parameters (a replica, never an alias of the master)."""
        out = cls(ln.features, group, eps=ln.eps, dtype=ln.params["weight"].dtype)
        out.params["weight"][...] = ln.params["weight"]
        out.params["bias"][...] = ln.params["bias"]
        return out

    def backward(self, dout: np.ndarray, cache) -> np.ndarray:
        """``dout: [b, s/p, h]`` -> ``dx: [b, s/p, h]``; adds the TP-summed (dw, db) into ``grads``."""
        xhat, rstd = cache
        dx, dw, db = layernorm_backward(dout, xhat, rstd, self.params["weight"])
        with self.group.tracer.region(scope=self.path, phase=SP_GRAD_SYNC):
            both = self.group.all_reduce(np.stack([dw, db]))  # one message for the two: [2, h]
        self.grads["weight"] += both[0]
        self.grads["bias"] += both[1]
        return dx

    def __repr__(self) -> str:
        return f"SequenceParallelLayerNorm({self.features}, eps={self.eps}, tp={self.group.size})"


class SequenceParallelLMHead(ParallelLMHead):
    """``ParallelLMHead`` fed a sequence shard: f̄ (all-gather in, reduce-scatter out) replaces f."""

    def forward(self, h: np.ndarray):
        """``h: [b, s/p, dim]`` this rank's positions -> ``(logits_local [b, s, Vp/p], cache = h)``."""
        with self.group.tracer.region(scope=self.path):
            full = GatherFromSequenceParallelRegion.forward(h, self.group)
            logits = linear_forward(full, self.params["weight"].T, None)
        return logits, h  # the shard, not ``full``: backward gathers it again

    def backward(self, dlogits: np.ndarray, h: np.ndarray) -> np.ndarray:
        """``dlogits: [b, s, Vp/p]`` -> ``dh: [b, s/p, dim]`` (summed over the vocabulary shards)."""
        with self.group.tracer.region(scope=self.path):
            full = regather_sequence(h, self.group)
            dh, dw_t, _ = linear_backward(dlogits, full, self.params["weight"].T, has_bias=False)
            self.grads["weight"] += dw_t.T  # += keeps the tied embedding's lookup gradients
            return GatherFromSequenceParallelRegion.backward(dh, self.group)

    def __repr__(self) -> str:
        return "Sequence" + super().__repr__()
