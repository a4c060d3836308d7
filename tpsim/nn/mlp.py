"""The transformer MLP, serial: Z = GeLU(X·A)·B  (GPT-2 names: c_fc = A [h, 4h], c_proj = B [4h, h]).

    x [..., h] --c_fc--> [..., ffn] --GeLU--> [..., ffn] --c_proj--> [..., h]

This is the serial twin of ``tpsim.tp.mlp.ParallelMLP``; both are built from the same master weights.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.nn.activations import GeluCache, gelu_backward, gelu_forward
from tpsim.nn.linear import Linear, LinearCache
from tpsim.nn.module import Module


class MLPCache(NamedTuple):
    """The cache of ``MLP`` and of its parallel twin."""

    c_fc: LinearCache  # holds x
    gelu: GeluCache  # holds h = x·A + a, GeLU's input
    c_proj: LinearCache  # holds GeLU(h), c_proj's input


class MLP(Module):
    def __init__(self, hidden: int, ffn_hidden: int | None = None, *, rng: np.random.Generator | None = None,
                 dtype=np.float64, std: float = 0.02, proj_std: float | None = None,
                 approximate: str = "tanh") -> None:
        super().__init__()
        rng = np.random.default_rng(0) if rng is None else rng
        ffn_hidden = 4 * hidden if ffn_hidden is None else ffn_hidden
        self.approximate = approximate
        self.c_fc = Linear(hidden, ffn_hidden, rng=rng, dtype=dtype, std=std)
        self.c_proj = Linear(ffn_hidden, hidden, rng=rng, dtype=dtype, std=std if proj_std is None else proj_std)

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, MLPCache]:
        """``x: [..., h]`` -> ``(z: [..., h], MLPCache)``."""
        h, c_fc = self.c_fc.forward(x)
        a, gelu = gelu_forward(h, self.approximate)
        z, c_proj = self.c_proj.forward(a)
        return z, MLPCache(c_fc, gelu, c_proj)

    def backward(self, dz: np.ndarray, cache: MLPCache) -> np.ndarray:
        """``dz: [..., h]`` -> ``dx: [..., h]``; adds into the grads of ``c_fc`` and ``c_proj``."""
        da = self.c_proj.backward(dz, cache.c_proj)
        dh = gelu_backward(da, cache.gelu)
        return self.c_fc.backward(dh, cache.c_fc)
