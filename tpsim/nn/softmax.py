"""Softmax along one axis, stable for any logit scale, and its Jacobian-vector product.

    y_i = exp(x_i − max(x)) / Σ_j exp(x_j − max(x))

Subtracting the max changes nothing mathematically (it cancels in the ratio) but keeps every exponent ≤ 0,
so logits ×1000 give no overflow and no NaN. The backward never builds the ``[V, V]`` Jacobian
``diag(y) − y yᵀ``; multiplying it by ``dy`` collapses to

    dx = y · (dy − Σ_j dy_j · y_j)

Attention uses this along the key axis; each tensor-parallel rank owns whole heads, so it stays local.
Along the last axis of a contiguous array both run block by block of rows (``tpsim.nn.chunked``): the same
operations on every row, so the same bits, with each block still in cache between its passes.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.kinds import SOFTMAX_NORM, marked
from tpsim.nn.chunked import row_views
from tpsim.nn.module import Module
from tpsim.nn.precision import fp32_inside


class SoftmaxCache(NamedTuple):
    y: np.ndarray  # [...] the forward's output: the backward needs only that
    axis: int


@marked(SOFTMAX_NORM)
@fp32_inside  # 16-bit in: float32 inside, the activation rounded back
def softmax_forward(x: np.ndarray, axis: int = -1) -> tuple[np.ndarray, SoftmaxCache]:
    """``x: [...]`` -> ``(y: [...], SoftmaxCache)``, ``y`` non-negative and summing to 1 along ``axis``."""
    if _rows(x, axis):  # the last axis of a contiguous array: block by block of rows (tpsim.nn.chunked)
        y = np.empty_like(x)
        for xs, ys in row_views(x, y):
            _forward(xs, ys, -1)
        return y, SoftmaxCache(y, axis)
    y = np.empty_like(x, dtype=np.result_type(x, 1.0))
    return _forward(x, y, axis), SoftmaxCache(y, axis)


def _forward(x: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
    """Into ``y`` (one buffer: shift, exp and normalise in place)."""
    np.subtract(x, x.max(axis=axis, keepdims=True), out=y)
    np.exp(y, out=y)
    y /= y.sum(axis=axis, keepdims=True)
    return y


@marked(SOFTMAX_NORM)
@fp32_inside  # 16-bit in: float32 inside, the activation rounded back
def softmax_backward(dy: np.ndarray, cache: SoftmaxCache) -> np.ndarray:
    """``dy: [...]`` -> ``dx: [...]``."""
    y, axis = cache
    dx = np.empty_like(y, dtype=np.result_type(dy, y))
    if _rows(y, axis) and dy.shape == y.shape and dy.flags.c_contiguous:
        for dys, ys, dxs in row_views(dy, y, dx):
            _backward(dys, ys, dxs, -1)
        return dx
    return _backward(dy, y, dx, axis)


def _backward(dy: np.ndarray, y: np.ndarray, dx: np.ndarray, axis: int) -> np.ndarray:
    """Into ``dx``: y · (dy − Σ dy · y)."""
    np.multiply(dy, y, out=dx)
    np.subtract(dy, dx.sum(axis=axis, keepdims=True), out=dx)
    dx *= y
    return dx


def _rows(x: np.ndarray, axis: int) -> bool:
    """Whether ``x`` is a contiguous float array of rows along its last axis (the chunked path)."""
    return x.ndim >= 2 and axis in (-1, x.ndim - 1) and x.flags.c_contiguous and x.dtype.kind == "f"


class Softmax(Module):
    """Softmax along ``axis``; no parameters. The cache holds the output ``y``: the backward needs only that."""

    def __init__(self, axis: int = -1) -> None:
        super().__init__()
        self.axis = axis

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, SoftmaxCache]:
        return softmax_forward(x, self.axis)

    def backward(self, dout: np.ndarray, cache: SoftmaxCache) -> np.ndarray:
        return softmax_backward(dout, cache)

    def __repr__(self) -> str:
        return f"Softmax(axis={self.axis})"
