"""Llama's MLP, serial: ``down(silu(gate(x)) * up(x))`` — the SwiGLU of Shazeer 2020 (arXiv:2002.05202).

    x [..., h] --gate_proj--> g [..., ffn] --SiLU--> a
    x [..., h] --up_proj----> u [..., ffn]
                                       m = a ⊙ u [..., ffn] --down_proj--> z [..., h]       (no biases)

Backward: ``dm = dz · Wdᵀ``; ``da = dm ⊙ u``, ``du = dm ⊙ a``; ``dg = silu'(g) ⊙ da``; and x fed both gate
and up, so ``dx = dg · Wgᵀ + du · Wuᵀ``. The product ``a ⊙ u`` pairs column j of gate with column j of up: a
tensor-parallel rank must hold *matching* gate and up columns (``tpsim.tp.swiglu.ParallelSwiGLU``).
``GatedMLP`` is the wiring written once: ``SwiGLU`` gives it serial ``Linear``s, the parallel layer its TP
twins built from the same master weights. gate_proj and up_proj read one input and run as one multi-output
linear (``tpsim.nn.multi_output_linear``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.kinds import ELEMENTWISE_MARK
from tpsim.nn.linear import Linear, LinearCache
from tpsim.nn.module import Module
from tpsim.nn.multi_output_linear import MultiOutputLinear
from tpsim.nn.silu import SiluCache, silu_backward, silu_forward


class SwiGLUCache(NamedTuple):
    """The cache of ``GatedMLP`` (serial or parallel)."""

    gate_up: tuple  # the caches of gate_proj and up_proj (one multi-output linear; both hold x)
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


class GatedMLP(Module):
    """``down_proj(silu(gate) ⊙ up)`` from its parts: ``gate_up`` (a multi-output linear of gate_proj and
    up_proj) and ``down_proj`` — serial ``Linear``s (``SwiGLU``) or their TP twins (``ParallelSwiGLU``)."""

    def __init__(self, gate_up: Module, down_proj: Module) -> None:
        super().__init__()
        self.gate_up, self.down_proj = gate_up, down_proj  # gate_up is inline: mlp.gate_proj, mlp.up_proj

    # the two projections under their Hugging Face names (they live in gate_up)
    gate_proj = property(lambda self: self.gate_up.gate_proj)
    up_proj = property(lambda self: self.gate_up.up_proj)

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, SwiGLUCache]:
        """``x: [..., h]`` (SP: ``[b, s/p, h]``) -> ``(z shaped as x, SwiGLUCache)``."""
        (g, u), c_gate_up = self.gate_up.forward(x)  # TP: f once for both (SP: f̄)
        m, c_silu, a = swiglu_product(g, u)  # elementwise on matching columns: no communication
        z, c_down = self.down_proj.forward(m)  # TP: g, all-reduce (SP: ḡ reduce-scatter)
        return z, SwiGLUCache(c_gate_up, c_silu, u, a, c_down)

    def backward(self, dz: np.ndarray, cache: SwiGLUCache) -> np.ndarray:
        """``dz`` shaped as the output -> ``dx`` shaped as the input; adds into the three projections' grads."""
        dg, du = swiglu_product_backward(self.down_proj.backward(dz, cache.down_proj), cache)
        return self.gate_up.backward((dg, du), cache.gate_up)  # TP: one f all-reduce for gate and up


class SwiGLU(GatedMLP):
    """Serial: ``gate_proj, up_proj: Linear(h, ffn)``, ``down_proj: Linear(ffn, h)``, all without bias."""

    def __init__(self, hidden: int, intermediate: int, *, rng: np.random.Generator | None = None,
                 dtype=np.float64, std: float = 0.02) -> None:
        rng = np.random.default_rng(0) if rng is None else rng
        gate, up, down = (Linear(n_in, n_out, bias=False, rng=rng, dtype=dtype, std=std)
                          for n_in, n_out in ((hidden, intermediate), (hidden, intermediate), (intermediate, hidden)))
        super().__init__(MultiOutputLinear({"gate_proj": gate, "up_proj": up}), down)
        self.hidden, self.intermediate = hidden, intermediate

    def __repr__(self) -> str:
        return f"SwiGLU(hidden={self.hidden}, intermediate={self.intermediate})"
