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
from tpsim.nn.precision import fp32_inside, fp32_weight_grads


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


def _input_grad(dy: np.ndarray, cache: RMSNormCache) -> np.ndarray:
    xhat, rstd, w = cache
    dxhat = dy * w
    dx = dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)  # the only path besides x̂ = x·rstd: rstd
    dx *= rstd
    return dx


def _weight_grad(dy: np.ndarray, cache: RMSNormCache) -> np.ndarray:
    return (dy * cache.xhat).reshape(-1, cache.w.shape[0]).sum(axis=0)


@marked(SOFTMAX_NORM)
@fp32_inside
def rmsnorm_backward_input(dy: np.ndarray, cache: RMSNormCache) -> np.ndarray:
    """The input gradient alone (the zero-bubble B): ``dy: [..., C]`` -> ``dx [..., C]``."""
    return _input_grad(dy, cache)


@marked(SOFTMAX_NORM)
@fp32_weight_grads  # 16-bit in: float32 inside and out (a parameter gradient)
def rmsnorm_backward_weight(dy: np.ndarray, cache: RMSNormCache) -> np.ndarray:
    """The weight gradient alone (the zero-bubble W): ``dy: [..., C]`` -> ``dw = Σ_rows dy·x̂ [C]``."""
    return _weight_grad(dy, cache)


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
        """``dout`` -> ``dx``; adds into ``grads["weight"]`` (W: ``Module.weight_grad``, keeping ``dout`` and x̂)."""
        self.weight_grad(self.add_weight_grads, dout, cache)
        return rmsnorm_backward_input(dout, cache)

    def add_weight_grads(self, dout: np.ndarray, cache: RMSNormCache) -> None:
        """W: ``grads["weight"] += Σ_rows dy·x̂``."""
        self.grads["weight"] += rmsnorm_backward_weight(dout, cache)

    def __repr__(self) -> str:
        return f"RMSNorm({self.features}, eps={self.eps})"
