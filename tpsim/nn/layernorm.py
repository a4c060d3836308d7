"""Layer normalisation over the last dimension, with the llm.c backward.

Forward, per row of ``C`` features:

    μ = mean(x)     rstd = 1 / √(mean((x − μ)²) + eps)     x̂ = (x − μ) · rstd     y = x̂ · w + b

Backward. ``dw = Σ_rows dy · x̂`` and ``db = Σ_rows dy`` are the easy part. For ``dx`` write
``dx̂ = dy · w``; x̂ depends on every x in its row through μ and rstd, and pushing ``dx̂`` back through both
gives (llm.c ``doc/layernorm``):

    dx = rstd · (dx̂ − mean(dx̂) − x̂ · mean(dx̂ · x̂))

The ``mean(dx̂)`` term is the path through μ and the ``x̂ · mean(dx̂ · x̂)`` term the path through rstd. So the
cache needs x̂ and rstd (plus a reference to w), nothing else. LayerNorm is replicated in tensor parallelism
(every rank holds the full ``C``); with sequence parallelism each rank normalises its own rows, which needs no
communication.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.kinds import SOFTMAX_NORM, marked
from tpsim.nn.module import Module
from tpsim.nn.precision import fp32_inside


class LayerNormCache(NamedTuple):
    xhat: np.ndarray  # [..., C] the normalised input
    rstd: np.ndarray  # [..., 1] 1 / σ of each row
    w: np.ndarray  # [C] the scale the forward used: a reference to the parameter, not a copy

    PARAMETERS = ("w",)


@marked(SOFTMAX_NORM)
@fp32_inside  # 16-bit in: float32 inside, the activation rounded back
def layernorm_forward(
    x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5
) -> tuple[np.ndarray, LayerNormCache]:
    """``x: [..., C]``, ``w, b: [C]`` -> ``(y: [..., C], LayerNormCache(xhat [..., C], rstd [..., 1], w))``."""
    mean = x.mean(axis=-1, keepdims=True)
    xhat = x - mean  # x − μ, normalised in place below (same operations, two buffers fewer)
    var = np.square(xhat).mean(axis=-1, keepdims=True)  # biased variance, as in PyTorch and GPT-2
    rstd = 1.0 / np.sqrt(var + eps)
    xhat *= rstd
    y = xhat * w
    y += b
    return y, LayerNormCache(xhat, rstd, w)


@marked(SOFTMAX_NORM)
@fp32_inside  # 16-bit in: float32 inside, the activation rounded back
def layernorm_backward(dy: np.ndarray, cache: LayerNormCache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``dy: [..., C]`` -> ``(dx [..., C], dw [C], db [C])``."""
    xhat, rstd, w = cache
    features = w.shape[0]
    scratch = dy * xhat
    dw = scratch.reshape(-1, features).sum(axis=0)
    db = dy.reshape(-1, features).sum(axis=0)
    dxhat = dy * w
    through_rstd = np.multiply(dxhat, xhat, out=scratch).mean(axis=-1, keepdims=True)
    dx = dxhat - dxhat.mean(axis=-1, keepdims=True)  # through the mean μ
    dx -= np.multiply(xhat, through_rstd, out=scratch)  # through rstd
    dx *= rstd
    return dx, dw, db


class LayerNorm(Module):
    """LayerNorm over the last dim: params ``weight`` (ones) and ``bias`` (zeros), both ``[features]``."""

    def __init__(self, features: int, *, eps: float = 1e-5, dtype=np.float64) -> None:
        super().__init__()
        self.features = features
        self.eps = eps
        self.add_param("weight", np.ones(features, dtype=dtype))
        self.add_param("bias", np.zeros(features, dtype=dtype))

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, LayerNormCache]:
        """``x: [..., features]`` -> ``(y: [..., features], LayerNormCache(xhat, rstd, w))``."""
        if x.shape[-1] != self.features:
            raise ValueError(f"LayerNorm({self.features}) got input with last dim {x.shape[-1]}")
        return layernorm_forward(x, self.params["weight"], self.params["bias"], self.eps)

    def backward(self, dout: np.ndarray, cache: LayerNormCache) -> np.ndarray:
        dx, dw, db = layernorm_backward(dout, cache)
        self.grads["weight"] += dw
        self.grads["bias"] += db
        return dx

    def __repr__(self) -> str:
        return f"LayerNorm({self.features}, eps={self.eps})"
