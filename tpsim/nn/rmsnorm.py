"""RMSNorm (Zhang & Sennrich 2019, arXiv:1910.07467): LayerNorm without the mean and without the bias.

Forward, per row of ``C`` features (Llama's ``LlamaRMSNorm``, Touvron et al. 2023):

    rstd = 1 / √(mean(x²) + eps)     x̂ = x · rstd     y = x̂ · w

Backward. ``dw = Σ_rows dy · x̂``. For ``dx`` write ``dx̂ = dy · w``; x̂ depends on every x of its row through
rstd only (there is no μ), so LayerNorm's formula loses its ``mean(dx̂)`` term:

    dx = rstd · (dx̂ − x̂ · mean(dx̂ · x̂))

The cache needs x̂ and rstd (plus a reference to w). Under tensor parallelism RMSNorm is replicated, like
LayerNorm; with sequence parallelism each rank normalises its own rows and the weight's gradient is a partial
sum over the sequence (``tpsim.tp.rmsnorm.SequenceParallelRMSNorm`` all-reduces it).
Hugging Face computes the norm in float32 whatever the input dtype; tpsim computes it in the input's dtype.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.kinds import SOFTMAX_NORM, marked
from tpsim.nn.module import Module
from tpsim.nn.precision import fp32_inside


class RMSNormCache(NamedTuple):
    xhat: np.ndarray  # [..., C] the normalised input
    rstd: np.ndarray  # [..., 1] 1 / rms of each row
    w: np.ndarray  # [C] the scale the forward used: a reference to the parameter, not a copy

    PARAMETERS = ("w",)


@marked(SOFTMAX_NORM)
@fp32_inside  # 16-bit in: float32 inside, the activation rounded back
def rmsnorm_forward(x: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> tuple[np.ndarray, RMSNormCache]:
    """``x: [..., C]``, ``w: [C]`` -> ``(y: [..., C], RMSNormCache(xhat, rstd [..., 1], w))``."""
    rstd = 1.0 / np.sqrt(np.square(x).mean(axis=-1, keepdims=True) + eps)
    xhat = x * rstd
    return xhat * w, RMSNormCache(xhat, rstd, w)


@marked(SOFTMAX_NORM)
@fp32_inside  # 16-bit in: float32 inside, the activation rounded back
def rmsnorm_backward(dy: np.ndarray, cache: RMSNormCache) -> tuple[np.ndarray, np.ndarray]:
    """``dy: [..., C]`` -> ``(dx [..., C], dw [C])``."""
    xhat, rstd, w = cache
    dw = (dy * xhat).reshape(-1, w.shape[0]).sum(axis=0)
    dxhat = dy * w
    dx = dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)  # the only path besides x̂ = x·rstd: rstd
    dx *= rstd
    return dx, dw


class RMSNorm(Module):
    """RMSNorm over the last dim: one parameter ``weight`` (ones) ``[features]``; Llama's eps default 1e-6."""

    def __init__(self, features: int, *, eps: float = 1e-6, dtype=np.float64) -> None:
        super().__init__()
        self.features = features
        self.eps = eps
        self.add_param("weight", np.ones(features, dtype=dtype))

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, RMSNormCache]:
        """``x: [..., features]`` -> ``(y: [..., features], RMSNormCache)``."""
        if x.shape[-1] != self.features:
            raise ValueError(f"RMSNorm({self.features}) got input with last dim {x.shape[-1]}")
        return rmsnorm_forward(x, self.params["weight"], self.eps)

    def backward(self, dout: np.ndarray, cache: RMSNormCache) -> np.ndarray:
        dx, dw = rmsnorm_backward(dout, cache)
        self.grads["weight"] += dw
        return dx

    def __repr__(self) -> str:
        return f"RMSNorm({self.features}, eps={self.eps})"
