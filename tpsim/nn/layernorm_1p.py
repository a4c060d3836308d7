"""LayerNorm with a zero-centred scale, "LayerNorm1P" (Megatron-LM's ``apply_layernorm_1p``; Nemotron-4):

    y = x̂ · (1 + w) + b          x̂ = (x − μ) · rstd, as in ``tpsim.nn.layernorm``

The stored weight w starts at 0 and the layer applies 1 + w, so weight decay pulls the scale towards 1, not 0
(Hugging Face's ``NemotronLayerNorm1P``). Since ∂(1 + w)/∂w = 1, every gradient is LayerNorm's with 1 + w as
its scale: dx from the effective scale the cache holds, dw = Σ dy·x̂ and db = Σ dy unchanged. So the layer is
LayerNorm's forward on ``1 + weight``, and LayerNorm's backward; the effective scale is a fresh [C] vector a
forward, named a parameter in the cache (``LayerNormCache.PARAMETERS``), not an activation. Replicated under
TP; under sequence parallelism its gradients are all-reduced like LayerNorm's (``tpsim.tp.sequence_parallel_
layernorm.SequenceParallelLayerNorm1P``).
"""

from __future__ import annotations

import numpy as np

from tpsim.nn.layernorm import LayerNorm, LayerNormCache, layernorm_forward


class ZeroCentredScale:
    """The forward of a LayerNorm whose scale is ``1 + weight`` (mixed into LayerNorm and its SP twin)."""

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, LayerNormCache]:
        """``x: [..., features]`` -> ``(y, LayerNormCache(xhat, rstd, 1 + weight))``."""
        if x.shape[-1] != self.features:
            raise ValueError(f"{type(self).__name__}({self.features}) got input with last dim {x.shape[-1]}")
        w = self.params["weight"]
        return layernorm_forward(x, w + np.asarray(1, dtype=w.dtype), self.params["bias"], self.eps)


class LayerNorm1P(ZeroCentredScale, LayerNorm):
    """LayerNorm over the last dim with scale ``1 + weight``: params ``weight`` (zeros) and ``bias`` (zeros)."""

    def __init__(self, features: int, *, eps: float = 1e-5, dtype=np.float64) -> None:
        super().__init__(features, eps=eps, dtype=dtype)
        self.params["weight"][...] = 0

    def __repr__(self) -> str:
        return f"LayerNorm1P({self.features}, eps={self.eps})"
