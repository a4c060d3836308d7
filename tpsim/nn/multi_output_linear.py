"""Several linears reading one input, as one layer: ``y_j = x · W_j`` — Llama's q/k/v and gate/up projections.

    x [..., in] --W_1--> y_1 [..., out_1]
                --W_2--> y_2 [..., out_2]   ...
    backward   dW_j = xᵀ·dy_j (each part's own)      dx = Σ_j dy_j·W_jᵀ (x fed every part, so its grads add up)

GPT-2 fuses such projections into one weight (``c_attn`` = q | k | v), Llama keeps them apart (``q_proj``,
``k_proj``, ``v_proj``; ``gate_proj``, ``up_proj``), and Megatron-LM fuses them again for speed. This layer keeps
the parts as ``Linear`` layers of their own — each owns its weight and gradient and keeps Hugging Face's
name — and gives the layer around them one ``forward(x) -> (outs, cache)`` and one ``backward(douts, cache)``.
It is ``inline`` (``tpsim.nn.module``): the parts are named as the parent's own (``self_attn.q_proj``).

The tensor-parallel twin (``tpsim.tp.multi_output_column_parallel``) enters the TP region once for all parts,
which is why the sum over the parts is a layer's business and not its caller's.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from tpsim.nn.linear import Linear, LinearCache
from tpsim.nn.module import Module


class MultiOutputLinear(Module):
    """``parts``: name -> ``Linear(in, out_j)``, all with the same ``in``; outputs in the parts' order."""

    inline = True

    def __init__(self, parts: Mapping[str, Linear]) -> None:
        super().__init__()
        check_parts(parts)
        for name, part in parts.items():
            setattr(self, name, part)
        self.names = tuple(parts)
        self.in_features = next(iter(parts.values())).in_features

    def parts(self) -> dict[str, Module]:
        """The parts by name, in the order of the outputs."""
        return {name: getattr(self, name) for name in self.names}

    def forward(self, x: np.ndarray) -> tuple[tuple[np.ndarray, ...], tuple[LinearCache, ...]]:
        """``x: [..., in]`` -> ``((y_j [..., out_j], ...), (LinearCache_j, ...))``."""
        outs, caches = zip(*(part.forward(x) for part in self.parts().values()))
        return outs, caches

    def backward(self, douts, caches) -> np.ndarray:
        """``dy_j [..., out_j]`` -> ``dx [..., in]`` (the sum over the parts); adds into each part's grads."""
        pairs = zip(self.parts().values(), douts, caches)
        first, dy, cache = next(pairs)
        dx = first.backward(dy, cache)
        for part, dy, cache in pairs:
            dx += part.backward(dy, cache)
        return dx

    def __repr__(self) -> str:
        return f"MultiOutputLinear({', '.join(f'{n}={p!r}' for n, p in self.parts().items())})"


def check_parts(parts: Mapping[str, Module]) -> None:
    """Raise ``ValueError`` unless there is at least one part and every part reads the same ``in_features``."""
    if not parts:
        raise ValueError("a multi-output linear needs at least one part")
    widths = {name: part.in_features for name, part in parts.items()}
    if len(set(widths.values())) != 1:
        raise ValueError(f"the parts of a multi-output linear must read one input, got in_features {widths}")
