"""The LayerNorm under sequence parallelism (Korthikanti et al. 2022, §4.2.2): replicated weights, partial gradients.

Its weight and bias stay replicated, but with SP each rank normalises only its s/p positions, so its parameter
gradients are partial sums over the sequence:

    forward   y_r = LN(x_r)                                 [b, s/p, h] -> [b, s/p, h]   (no communication)
    backward  dx_r as serial;  (dw, db) = all_reduce(Σ_{rows of r} (dy·x̂, dy))          one [2, h] all-reduce

The all-reduce is traced as scope = the LayerNorm's path (``transformer.h.0.ln_1``), phase ``SP_GRAD_SYNC``
(``tpsim.phases``): it is a gradient synchronisation of a replicated parameter, not an activation's operator,
so a trace keeps it apart from the forward/backward f̄/ḡ traffic. Only the *new* contribution is reduced,
before it is added to ``grads`` — what ``grads`` held already (previous micro-batches, all ranks equal) must
not be summed p times. The all-reduce belongs to the weight gradient (W, ``Module.weight_grad``): a deferred W
takes it along.
Megatron does the same sum once per step for all such parameters (``sequence_parallel`` attribute,
coalesced in ``finalize_model_grads``); per layer is the readable version of it.

The other replicated parameters whose input is a sequence shard need nothing: the row-parallel bias takes its
gradient from the all-gathered dz (``row_parallel.py``) and the position embedding is added before the
sequence is scattered (``tpsim.models.gpt``), so their gradients are already complete on every rank.

The other layer that changes under SP, the tied LM head, is the column-parallel layer with f̄ in front: it
is built with ``region=SP_REGION`` (``tpsim.tp.lm_head``).
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.nn.layernorm import LayerNorm, LayerNormCache, layernorm_backward_weight
from tpsim.nn.layernorm_1p import ZeroCentredScale
from tpsim.phases import SP_GRAD_SYNC


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

    def add_weight_grads(self, dout: np.ndarray, cache: LayerNormCache) -> None:
        """W (``backward`` is LayerNorm's): ``grads += all_reduce(Σ_{rows of r} (dy·x̂, dy))``, one [2, h] message."""
        dw, db = layernorm_backward_weight(dout, cache)
        with self.group.tracer.region(scope=self.path, phase=SP_GRAD_SYNC):
            both = self.group.all_reduce(np.stack([dw, db]))  # one message for the two: [2, h]
        self.grads["weight"] += both[0]
        self.grads["bias"] += both[1]

    def __repr__(self) -> str:
        return f"SequenceParallelLayerNorm({self.features}, eps={self.eps}, tp={self.group.size})"


class SequenceParallelLayerNorm1P(ZeroCentredScale, SequenceParallelLayerNorm):
    """``SequenceParallelLayerNorm`` with the scale ``1 + weight`` (``tpsim.nn.layernorm_1p``): the same gradients,
    the same one [2, h] all-reduce."""

    def __repr__(self) -> str:
        return f"SequenceParallelLayerNorm1P({self.features}, eps={self.eps}, tp={self.group.size})"
