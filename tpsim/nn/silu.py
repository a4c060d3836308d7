"""SiLU (swish), the gate's nonlinearity in Llama's SwiGLU MLP (Shazeer 2020, arXiv:2002.05202).

    silu(x) = x · σ(x)          silu'(x) = σ(x) · (1 + x · (1 − σ(x)))          σ(x) = 1 / (1 + e^(−x))

σ is computed from e^(−|x|), which never overflows: σ(x) = 1 / (1 + e) for x ≥ 0 and e / (1 + e) for x < 0.
Elementwise, like GeLU, so a column-parallel shard applies it with no communication.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.kinds import ELEMENTWISE, marked
from tpsim.nn.module import Module
from tpsim.nn.precision import fp32_inside


def sigmoid(x: np.ndarray) -> np.ndarray:
    """σ(x) in ``x``'s dtype, without overflow for large |x|."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0, e) / (1.0 + e)


class SiluCache(NamedTuple):
    x: np.ndarray  # [...] the input: σ is recomputed from it


@marked(ELEMENTWISE)
@fp32_inside  # 16-bit in: float32 inside, the activation rounded back
def silu_forward(x: np.ndarray) -> tuple[np.ndarray, SiluCache]:
    """``x: [...]`` -> ``(x · σ(x): [...], SiluCache(x))``."""
    return x * sigmoid(x), SiluCache(x)


@marked(ELEMENTWISE)
@fp32_inside  # 16-bit in: float32 inside, the activation rounded back
def silu_backward(dy: np.ndarray, cache: SiluCache) -> np.ndarray:
    """``dy: [...]`` -> ``dx = dy · σ(x) · (1 + x · (1 − σ(x)))``."""
    x = cache.x
    s = sigmoid(x)
    return dy * s * (1.0 + x * (1.0 - s))


class SiLU(Module):
    """Elementwise SiLU; no parameters."""

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, SiluCache]:
        return silu_forward(x)

    def backward(self, dout: np.ndarray, cache: SiluCache) -> np.ndarray:
        return silu_backward(dout, cache)

    def __repr__(self) -> str:
        return "SiLU()"
