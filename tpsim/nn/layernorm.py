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
communication. Both directions run block by block of rows (``tpsim.nn.chunked``; the same operations on each
row, so the same bits), except the sums over rows of ``dw`` and ``db``, done on the whole array in one order.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.kinds import SOFTMAX_NORM, marked
from tpsim.nn.chunked import row_views
from tpsim.nn.module import Module
from tpsim.nn.precision import fp32_inside, fp32_weight_grads


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
    x = np.asarray(x)
    xhat = np.empty(x.shape, dtype=np.result_type(x, 1.0))  # C order whatever x's: row_views writes into views
    rstd = np.empty(x.shape[:-1] + (1,), dtype=xhat.dtype)
    y = np.empty_like(xhat, dtype=np.result_type(xhat, w))
    for xs, xh, rs, ys in row_views(x, xhat, rstd, y):  # block by block of rows: in cache (tpsim.nn.chunked)
        np.subtract(xs, xs.mean(axis=-1, keepdims=True), out=xh)  # x − μ, normalised in place below
        var = np.square(xh).mean(axis=-1, keepdims=True)  # biased variance, as in PyTorch and GPT-2
        np.divide(1.0, np.sqrt(var + eps), out=rs)
        xh *= rs
        np.multiply(xh, w, out=ys)
        ys += b
    return y, LayerNormCache(xhat, rstd, w)


def _input_grad(dy: np.ndarray, cache: LayerNormCache) -> np.ndarray:
    xhat, rstd, w = cache
    dy = np.asarray(dy)
    scratch = np.empty(dy.shape, dtype=np.result_type(dy, xhat))
    dx = np.empty_like(scratch, dtype=np.result_type(dy, w))
    for dys, xh, rs, dxs, sc in row_views(dy, xhat, rstd, dx, scratch):  # per row: block by block
        np.multiply(dys, w, out=dxs)  # dx̂
        through_rstd = np.multiply(dxs, xh, out=sc).mean(axis=-1, keepdims=True)
        dxs -= dxs.mean(axis=-1, keepdims=True)  # through the mean μ
        dxs -= np.multiply(xh, through_rstd, out=sc)  # through rstd
        dxs *= rs
    return dx


def _weight_grads(dy: np.ndarray, cache: LayerNormCache) -> tuple[np.ndarray, np.ndarray]:
    xhat, _, w = cache
    features = w.shape[0]
    dy = np.asarray(dy)
    dw = (dy * xhat).reshape(-1, features).sum(axis=0)  # sums over every row: done whole, in one order
    return dw, dy.reshape(-1, features).sum(axis=0)


@marked(SOFTMAX_NORM)
@fp32_inside  # 16-bit in: float32 inside, the activation rounded back
def layernorm_backward(dy: np.ndarray, cache: LayerNormCache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``dy: [..., C]`` -> ``(dx [..., C], dw [C], db [C])``: ``layernorm_backward_input`` and ``_weight`` at once."""
    return (_input_grad(dy, cache), *_weight_grads(dy, cache))


@marked(SOFTMAX_NORM)
@fp32_inside
def layernorm_backward_input(dy: np.ndarray, cache: LayerNormCache) -> np.ndarray:
    """The input gradient alone (the zero-bubble B): ``dy: [..., C]`` -> ``dx [..., C]``."""
    return _input_grad(dy, cache)


@marked(SOFTMAX_NORM)
@fp32_weight_grads  # 16-bit in: float32 inside and out (parameter gradients)
def layernorm_backward_weight(dy: np.ndarray, cache: LayerNormCache) -> tuple[np.ndarray, np.ndarray]:
    """The parameter gradients alone (the zero-bubble W): ``dy: [..., C]`` -> ``(dw = Σ dy·x̂, db = Σ dy)``, ``[C]``."""
    return _weight_grads(dy, cache)


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
        """``dout`` -> ``dx``; adds into ``grads`` (W: ``Module.weight_grad``, which keeps ``dout`` and x̂)."""
        self.weight_grad(self.add_weight_grads, dout, cache)
        return layernorm_backward_input(dout, cache)

    def add_weight_grads(self, dout: np.ndarray, cache: LayerNormCache) -> None:
        """W: ``grads += (Σ dy·x̂, Σ dy)`` over every row."""
        dw, db = layernorm_backward_weight(dout, cache)
        self.grads["weight"] += dw
        self.grads["bias"] += db

    def __repr__(self) -> str:
        return f"LayerNorm({self.features}, eps={self.eps})"
