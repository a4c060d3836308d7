"""A fully connected layer, ``y = x · W + b``, with its backward written out.

The weight is stored ``[in, out]`` (GPT-2's Conv1D layout), so the forward is a plain ``x @ W`` and the two
tensor-parallel splits are easy to see: a *column*-parallel layer keeps ``W[:, cols]``, a *row*-parallel
layer keeps ``W[rows, :]``. The backward of ``y = x W + b`` is the three lines every framework hides:

    dx = dy · Wᵀ        dW = xᵀ · dy        db = Σ_rows dy

Leading dimensions (batch, sequence, ...) are folded into one row dimension for the matmuls, so
``x: [..., in] -> y: [..., out]`` for any number of leading dims. The pure functions are what the parallel
layers reuse on their shards; ``Linear`` is the serial layer built on them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.kinds import MATMUL, marked
from tpsim.nn.module import Module
from tpsim.nn.precision import matmul, row_sum, wgrad


class LinearCache(NamedTuple):
    x: np.ndarray  # [..., in] the input (a parallel layer may keep a shard and rebuild it, see tpsim.tp)
    w: np.ndarray  # [in, out] the weight the forward used: a reference to the parameter, not a copy
    has_bias: bool

    PARAMETERS = ("w",)


@marked(MATMUL)
def linear_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> tuple[np.ndarray, LinearCache]:
    """``x: [..., in]``, ``w: [in, out]``, ``b: [out]`` or None  ->  ``(y: [..., out], LinearCache)``."""
    x2 = x.reshape(-1, w.shape[0])  # a view when x is contiguous: no copy of the activations
    y = matmul(x2, w)  # 16-bit: float32 accumulation, rounded (tpsim.nn.precision)
    if b is not None:
        y += b  # y is a fresh array, so adding in place saves one allocation
    return y.reshape(*x.shape[:-1], w.shape[1]), LinearCache(x, w, b is not None)


def _input_grad(dy: np.ndarray, cache: LinearCache) -> np.ndarray:
    w = cache.w  # x is not read: a sequence-parallel layer's cache holds only its shard of it
    return matmul(dy.reshape(-1, w.shape[1]), w.T).reshape(*dy.shape[:-1], w.shape[0])


def _weight_grads(dy: np.ndarray, cache: LinearCache) -> tuple[np.ndarray, np.ndarray | None]:
    x, w, has_bias = cache
    fan_in, fan_out = w.shape
    dy2 = dy.reshape(-1, fan_out)
    dw = wgrad(x.reshape(-1, fan_in).T, dy2)  # sums the outer products of every row: each row used the same W
    return dw, (row_sum(dy2) if has_bias else None)


@marked(MATMUL)
def linear_backward(dy: np.ndarray, cache: LinearCache) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Gradients of ``y = x·w + b``: ``dy: [..., out]`` -> ``(dx [..., in], dw [in, out], db [out] or None)``.

    ``db`` is None when the forward had no bias. The two halves, ``linear_backward_input`` (dx) and
    ``linear_backward_weight`` (dw, db), give the same bits apart.
    """
    return (_input_grad(dy, cache), *_weight_grads(dy, cache))


@marked(MATMUL)
def linear_backward_input(dy: np.ndarray, cache: LinearCache) -> np.ndarray:
    """The input gradient alone (the zero-bubble B): ``dy: [..., out]`` -> ``dx = dy·wᵀ [..., in]``."""
    return _input_grad(dy, cache)


@marked(MATMUL)
def linear_backward_weight(dy: np.ndarray, cache: LinearCache) -> tuple[np.ndarray, np.ndarray | None]:
    """The weight gradients alone (the zero-bubble W): ``dy: [..., out]`` -> ``(dw = xᵀ·dy [in, out], db)``."""
    return _weight_grads(dy, cache)


class Linear(Module):
    """``y = x · weight + bias`` with ``weight: [in_features, out_features]`` and ``bias: [out_features]``."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool = True,
        rng: np.random.Generator | None = None,
        dtype=np.float64,
        std: float = 0.02,
        weight: np.ndarray | None = None,
        bias_value: np.ndarray | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.has_bias = bias
        if weight is None:
            rng = np.random.default_rng(0) if rng is None else rng
            weight = rng.normal(0.0, std, size=(in_features, out_features))
        elif np.shape(weight) != (in_features, out_features):
            raise ValueError(f"weight must have shape {(in_features, out_features)}, got {np.shape(weight)}")
        # np.array copies: a layer built from master weights must never alias (and later update) them
        self.add_param("weight", np.array(weight, dtype=dtype))
        if bias:
            if bias_value is None:
                bias_value = np.zeros(out_features)
            elif np.shape(bias_value) != (out_features,):
                raise ValueError(f"bias_value must have shape {(out_features,)}, got {np.shape(bias_value)}")
            self.add_param("bias", np.array(bias_value, dtype=dtype))
        elif bias_value is not None:
            raise ValueError("bias_value given but bias=False")

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, LinearCache]:
        """``x: [..., in]`` -> ``(y: [..., out], LinearCache)``."""
        return linear_forward(x, self.params["weight"], self.params.get("bias"))

    def backward(self, dout: np.ndarray, cache: LinearCache) -> np.ndarray:
        """``dout: [..., out]`` -> ``dx: [..., in]``; adds into ``grads["weight"]`` and ``grads["bias"]`` (W:
        ``Module.weight_grad``, which keeps the input and ``dout`` for it)."""
        self.weight_grad(self.add_weight_grads, dout, cache)
        return linear_backward_input(dout, cache)

    def add_weight_grads(self, dout: np.ndarray, cache: LinearCache) -> None:
        """W: ``grads["weight"] += xᵀ·dout`` (and the bias's ``Σ dout``)."""
        dw, db = linear_backward_weight(dout, cache)
        self.grads["weight"] += dw
        if db is not None:
            self.grads["bias"] += db

    def __repr__(self) -> str:
        return f"Linear({self.in_features}, {self.out_features}, bias={self.has_bias})"
