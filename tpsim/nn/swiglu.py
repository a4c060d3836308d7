"""Llama's MLP, serial: ``down(silu(gate(x)) * up(x))`` — the SwiGLU of Shazeer 2020 (arXiv:2002.05202).

    x [..., h] --gate_proj--> g [..., ffn] --SiLU--> a
    x [..., h] --up_proj----> u [..., ffn]
                                       m = a ⊙ u [..., ffn] --down_proj--> z [..., h]       (no biases)

Backward: ``dm = dz · Wdᵀ``; ``da = dm ⊙ u``, ``du = dm ⊙ a``; ``dg = silu'(g) ⊙ da``; and x fed both gate
and up, so ``dx = dg · Wgᵀ + du · Wuᵀ``. The product ``a ⊙ u`` pairs column j of gate with column j of up: a
tensor-parallel rank must hold *matching* gate and up columns (``tpsim.tp.llama_layers.ParallelSwiGLU``).
The serial twin of that layer; both are built from the same master weights.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.kinds import ELEMENTWISE_MARK
from tpsim.nn.linear import Linear, LinearCache
from tpsim.nn.module import Module
from tpsim.nn.silu import SiluCache, silu_backward, silu_forward


class SwiGLUCache(NamedTuple):
    """The cache of ``SwiGLU`` and of its parallel twin."""

    gate_proj: LinearCache  # holds x
    up_proj: LinearCache  # holds x too (the same array)
    silu: SiluCache  # holds g, the gate's output
    up: np.ndarray  # [..., ffn] u, the up projection's output
    act: np.ndarray  # [..., ffn] a = silu(g)
    down_proj: LinearCache  # holds m = a ⊙ u


def swiglu_product(g: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, SiluCache, np.ndarray]:
    """``silu(g) ⊙ u`` -> ``(m, silu cache, a)``: the elementwise middle, shared with the parallel layer."""
    a, c_silu = silu_forward(g)
    with ELEMENTWISE_MARK:
        m = a * u
    return m, c_silu, a


def swiglu_product_backward(dm: np.ndarray, cache: SwiGLUCache) -> tuple[np.ndarray, np.ndarray]:
    """``dm [..., ffn]`` -> ``(dg, du)``, the gradients of the gate's and the up projection's outputs."""
    with ELEMENTWISE_MARK:
        da, du = dm * cache.up, dm * cache.act
    return silu_backward(da, cache.silu), du


class SwiGLU(Module):
    """``gate_proj, up_proj: Linear(h, ffn)``, ``down_proj: Linear(ffn, h)``, all without bias."""

    def __init__(self, hidden: int, intermediate: int, *, rng: np.random.Generator | None = None,
                 dtype=np.float64, std: float = 0.02) -> None:
        super().__init__()
        rng = np.random.default_rng(0) if rng is None else rng
        self.hidden, self.intermediate = hidden, intermediate
        self.gate_proj = Linear(hidden, intermediate, bias=False, rng=rng, dtype=dtype, std=std)
        self.up_proj = Linear(hidden, intermediate, bias=False, rng=rng, dtype=dtype, std=std)
        self.down_proj = Linear(intermediate, hidden, bias=False, rng=rng, dtype=dtype, std=std)

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, SwiGLUCache]:
        """``x: [..., h]`` -> ``(z: [..., h], SwiGLUCache)``."""
        g, c_gate = self.gate_proj.forward(x)
        u, c_up = self.up_proj.forward(x)
        m, c_silu, a = swiglu_product(g, u)
        z, c_down = self.down_proj.forward(m)
        return z, SwiGLUCache(c_gate, c_up, c_silu, u, a, c_down)

    def backward(self, dz: np.ndarray, cache: SwiGLUCache) -> np.ndarray:
        """``dz: [..., h]`` -> ``dx: [..., h]``; adds into the three projections' grads."""
        dg, du = swiglu_product_backward(self.down_proj.backward(dz, cache.down_proj), cache)
        dx = self.gate_proj.backward(dg, cache.gate_proj)
        dx += self.up_proj.backward(du, cache.up_proj)
        return dx

    def __repr__(self) -> str:
        return f"SwiGLU(hidden={self.hidden}, intermediate={self.intermediate})"
