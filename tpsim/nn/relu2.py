"""Squared ReLU, relu(x)², and the un-gated MLP it drives (So et al. 2021, Primer, arXiv:2109.08668; Nemotron-4).

    relu2(x)  = max(x, 0)²              relu2'(x) = 2 · max(x, 0)
    x [..., h] --up_proj--> u [..., F] --relu2--> [..., F] --down_proj--> [..., h]       (no gate, no biases)

Hugging Face's ``NemotronMLP`` with ``hidden_act = "relu2"`` (``ReLUSquaredActivation``). Like GeLU the
activation is elementwise, so tensor parallelism applies it to a column-parallel slice of u with no
communication: ``Relu2MLP`` is the wiring on whatever two linears it is given (serial ``Linear`` in
``SquaredReluMLP``, column- and row-parallel in ``tpsim.tp.relu2_mlp``), the same forward and backward for both.
The cache keeps u (the backward's 2·max(u, 0) is recomputed from it) and, in the linears' caches, the input of
each.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.kinds import ELEMENTWISE, marked
from tpsim.nn.linear import Linear, LinearCache
from tpsim.nn.module import Module
from tpsim.nn.precision import fp32_inside


class Relu2Cache(NamedTuple):
    x: np.ndarray  # [...] the input


@marked(ELEMENTWISE)
@fp32_inside  # 16-bit in: float32 inside, the activation rounded back
def relu2_forward(x: np.ndarray) -> tuple[np.ndarray, Relu2Cache]:
    """``x: [...]`` -> ``(max(x, 0)²: [...], Relu2Cache(x))``."""
    y = np.maximum(x, 0.0)
    y *= y
    return y, Relu2Cache(x)


@marked(ELEMENTWISE)
@fp32_inside
def relu2_backward(dy: np.ndarray, cache: Relu2Cache) -> np.ndarray:
    """``dy: [...]`` -> ``dx = dy · 2·max(x, 0)``."""
    dx = np.maximum(cache.x, 0.0)
    dx *= 2.0
    dx *= dy
    return dx


class Relu2MLPCache(NamedTuple):
    up_proj: LinearCache  # holds x
    relu2: Relu2Cache  # holds u = x·U
    down_proj: LinearCache  # holds relu2(u)


class Relu2MLP(Module):
    """``down_proj(relu2(up_proj(x)))`` from its two linear layers (any pair with the ``Linear`` contract)."""

    def __init__(self, up_proj: Module, down_proj: Module) -> None:
        super().__init__()
        self.up_proj, self.down_proj = up_proj, down_proj

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, Relu2MLPCache]:
        """``x: [..., h]`` (SP: ``[b, s/p, h]``) -> ``(z, cache)``, ``z`` shaped as ``x``."""
        u, c_up = self.up_proj.forward(x)  # TP: [..., F/p], f (SP: f̄, the all-gather)
        a, c_act = relu2_forward(u)
        z, c_down = self.down_proj.forward(a)  # TP: partial sums, g (SP: ḡ, the reduce-scatter)
        return z, Relu2MLPCache(c_up, c_act, c_down)

    def backward(self, dz: np.ndarray, cache: Relu2MLPCache) -> np.ndarray:
        """``dz`` shaped as the output -> ``dx`` shaped as the input; adds into up_proj's and down_proj's grads."""
        da = self.down_proj.backward(dz, cache.down_proj)
        return self.up_proj.backward(relu2_backward(da, cache.relu2), cache.up_proj)


class SquaredReluMLP(Relu2MLP):
    """Serial: ``up_proj = Linear(h, F)``, ``down_proj = Linear(F, h)``, no biases, drawn from ``rng`` in order."""

    def __init__(self, hidden: int, ffn_hidden: int, *, rng: np.random.Generator | None = None, dtype=np.float64,
                 std: float = 0.02) -> None:
        rng = np.random.default_rng(0) if rng is None else rng
        super().__init__(Linear(hidden, ffn_hidden, bias=False, rng=rng, dtype=dtype, std=std),
                         Linear(ffn_hidden, hidden, bias=False, rng=rng, dtype=dtype, std=std))

    def __repr__(self) -> str:
        return f"SquaredReluMLP({self.up_proj.in_features}, {self.up_proj.out_features})"
