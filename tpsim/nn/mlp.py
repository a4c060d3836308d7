"""The transformer MLP: Z = GeLU(X·A)·B  (GPT-2 names: c_fc = A [h, 4h], c_proj = B [4h, h]), written once.

    x [..., h] --c_fc--> [..., ffn] --GeLU--> [..., ffn] --c_proj--> [..., h]

``GeluMLP`` is that wiring on whatever two linears it is given: ``MLP`` draws serial ``Linear`` ones, and
``tpsim.tp.mlp.ParallelMLP`` takes a column-parallel c_fc and a row-parallel c_proj built from the same
master weights — the same forward and backward run both, so "TP equals serial" tests only the linears.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.nn.activations import GeluCache, gelu_backward, gelu_forward
from tpsim.nn.linear import Linear, LinearCache
from tpsim.nn.module import Module


class MLPCache(NamedTuple):
    """The cache of ``GeluMLP`` (serial or parallel)."""

    c_fc: LinearCache  # holds x
    gelu: GeluCache  # holds h = x·A + a, GeLU's input
    c_proj: LinearCache  # holds GeLU(h), c_proj's input


class GeluMLP(Module):
    """``c_proj(GeLU(c_fc(x)))`` from its two linear layers (any pair with the ``Linear`` contract)."""

    def __init__(self, c_fc: Module, c_proj: Module, approximate: str = "tanh") -> None:
        super().__init__()
        self.c_fc, self.c_proj, self.approximate = c_fc, c_proj, approximate

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, MLPCache]:
        """``x: [..., h]`` (SP: ``[b, s/p, h]``) -> ``(z, MLPCache)``, ``z`` shaped as ``x``."""
        h, c_fc = self.c_fc.forward(x)  # TP: [..., ffn/p], no communication (f is the identity)
        a, gelu = gelu_forward(h, self.approximate)  # element-wise: fine on a column slice
        z, c_proj = self.c_proj.forward(a)  # TP: partial sums, all-reduced by g
        return z, MLPCache(c_fc, gelu, c_proj)

    def backward(self, dz: np.ndarray, cache: MLPCache) -> np.ndarray:
        """``dz`` shaped as the output -> ``dx`` shaped as the input; adds into the grads of c_fc and c_proj."""
        da = self.c_proj.backward(dz, cache.c_proj)
        dh = gelu_backward(da, cache.gelu)
        return self.c_fc.backward(dh, cache.c_fc)  # TP: f's all-reduce happens in c_fc


class MLP(GeluMLP):
    """The serial MLP: ``c_fc = Linear(h, ffn)`` and ``c_proj = Linear(ffn, h)`` drawn from ``rng`` in that order."""

    def __init__(self, hidden: int, ffn_hidden: int | None = None, *, rng: np.random.Generator | None = None,
                 dtype=np.float64, std: float = 0.02, proj_std: float | None = None,
                 approximate: str = "tanh") -> None:
        rng = np.random.default_rng(0) if rng is None else rng
        ffn_hidden = 4 * hidden if ffn_hidden is None else ffn_hidden
        c_fc = Linear(hidden, ffn_hidden, rng=rng, dtype=dtype, std=std)
        c_proj = Linear(ffn_hidden, hidden, rng=rng, dtype=dtype, std=std if proj_std is None else proj_std)
        super().__init__(c_fc, c_proj, approximate)
