"""GeLU, the MLP's nonlinearity, in GPT-2's tanh form and the exact erf form, each with its derivative.

    exact:  gelu(x) = x · Φ(x) = 0.5 · x · (1 + erf(x / √2))
    tanh:   gelu(x) ≈ 0.5 · x · (1 + tanh(u)),   u = √(2/π) · (x + 0.044715 · x³)     (GPT-2's ``gelu_new``)

Derivatives, by the product rule:

    exact:  gelu'(x) = Φ(x) + x · φ(x),           φ(x) = exp(−x²/2) / √(2π)
    tanh:   gelu'(x) = 0.5 · (1 + t) + 0.5 · x · (1 − t²) · √(2/π) · (1 + 3 · 0.044715 · x²),   t = tanh(u)

GeLU is elementwise, which is why tensor parallelism can apply it to a column-parallel shard without talking
to any other rank. NumPy has no ``erf``; ``tpsim.nn.erf`` is a vectorised one within a few ulp of libm, and the
exact form takes Φ(x) = erfc(−x/√2) / 2, which stays accurate in the left tail where 1 + erf(x/√2) cancels.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from tpsim.kinds import ELEMENTWISE, marked
from tpsim.nn.chunked import CHUNK_BYTES, chunk_slices
from tpsim.nn.erf import erf, erfc  # noqa: F401  (erf: re-exported by tpsim.nn)
from tpsim.nn.module import Module
from tpsim.nn.precision import fp32_inside

APPROXIMATIONS = ("tanh", "none")
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_SQRT_2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_CUBIC = 0.044715



def _normal_cdf(x: np.ndarray) -> np.ndarray:
    """Φ(x) = erfc(−x/√2) / 2, in ``x``'s dtype: no cancellation in the left tail, unlike (1 + erf(x/√2)) / 2."""
    cdf = erfc(-x / _SQRT_2)  # x / √2 exactly as written: x · (1/√2) would round the argument differently
    cdf *= 0.5
    return cdf


def _tanh_u(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``tanh(√(2/π) · (x + 0.044715 · x³))`` written into ``out`` (shaped as ``x``, in ``x``'s float dtype).

    ``x * x * x``, not ``x**3``: NumPy's ``power`` takes its slow general path for an exponent of 3 (~300× slower
    than two multiplications on a float32 array here), and every step is done in place so the tanh form costs
    one buffer instead of five temporaries.
    """
    u = np.multiply(x, x, out=out)
    u *= x
    u *= _CUBIC
    u += x
    u *= _SQRT_2_OVER_PI
    return np.tanh(u, out=u)


def _flat(x: np.ndarray) -> np.ndarray:
    """``x`` as one flat array (a view when ``x`` is contiguous), an array even for a 0-d or scalar ``x``."""
    return np.ravel(np.asarray(x))


def _check(approximate: str) -> None:
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"approximate must be one of {APPROXIMATIONS}, got {approximate!r}")


class GeluCache(NamedTuple):
    x: np.ndarray  # [...] the input: recomputing tanh from it beats storing it
    approximate: str


@marked(ELEMENTWISE)
@fp32_inside  # 16-bit in: float32 inside, the activation rounded back
def gelu_forward(x: np.ndarray, approximate: str = "tanh") -> tuple[np.ndarray, GeluCache]:
    """``x: [...]`` -> ``(gelu(x): [...], GeluCache)``; ``approximate`` is ``"tanh"`` (GPT-2) or ``"none"`` (erf)."""
    _check(approximate)
    if approximate == "tanh":
        xf = _flat(x)
        y = np.empty_like(xf, dtype=np.result_type(xf, 1.0))
        for part in chunk_slices(xf.size, y.itemsize):  # slice by slice: stays in L2 (tpsim.nn.chunked)
            xs = xf[part]
            t = _tanh_u(xs, out=y[part])
            t += 1.0
            t *= xs
            t *= 0.5  # 0.5 · x · (1 + t), computed in place
        return y.reshape(np.shape(x)), GeluCache(x, approximate)
    y = _normal_cdf(x)
    y *= x
    return y, GeluCache(x, approximate)


@marked(ELEMENTWISE)
@fp32_inside  # 16-bit in: float32 inside, the activation rounded back
def gelu_backward(dy: np.ndarray, cache: GeluCache) -> np.ndarray:
    """``dy: [...]`` -> ``dx = dy · gelu'(x): [...]``."""
    x, approximate = cache
    if approximate == "tanh":
        xf, dyf = _flat(x), _flat(dy)
        dx = np.empty_like(xf, dtype=np.result_type(xf, 1.0))
        scratch = np.empty((2, min(xf.size, CHUNK_BYTES // dx.itemsize)), dtype=dx.dtype)
        for part in chunk_slices(xf.size, dx.itemsize):  # slice by slice: stays in L2 (tpsim.nn.chunked)
            xs, n = xf[part], part.stop - part.start
            t = _tanh_u(xs, out=dx[part])
            du_dx = np.multiply(xs, xs, out=scratch[0, :n])  # x², then u' = √(2/π) · (1 + 3·0.044715·x²)
            du_dx *= 3.0 * _CUBIC
            du_dx += 1.0
            du_dx *= _SQRT_2_OVER_PI
            slope = np.multiply(t, t, out=scratch[1, :n])  # 1 − t², then 0.5 · x · (1 − t²) · u'
            np.subtract(1.0, slope, out=slope)
            slope *= xs
            slope *= du_dx
            slope *= 0.5
            t += 1.0  # 0.5 · (1 + t) + slope, then · dy
            t *= 0.5
            t += slope
            t *= dyf[part]
        return dx.reshape(np.shape(x))
    dx = np.multiply(x, x, out=np.empty_like(x, dtype=np.result_type(x, 1.0)))  # x · φ(x) + Φ(x), then · dy
    dx *= -0.5
    np.exp(dx, out=dx)
    dx *= _INV_SQRT_2PI
    dx *= x
    dx += _normal_cdf(x)
    dx *= dy
    return dx


class GeLU(Module):
    """Elementwise GeLU; no parameters. The cache holds the input ``x`` (recomputing ``tanh`` beats storing it)."""

    def __init__(self, approximate: str = "tanh") -> None:
        super().__init__()
        _check(approximate)
        self.approximate = approximate

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, GeluCache]:
        return gelu_forward(x, self.approximate)

    def backward(self, dout: np.ndarray, cache: GeluCache) -> np.ndarray:
        return gelu_backward(dout, cache)

    def __repr__(self) -> str:
        return f"GeLU(approximate={self.approximate!r})"
