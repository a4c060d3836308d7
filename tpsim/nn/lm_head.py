"""The GPT output layer tied to the token embedding, serial: logits = h · Wᵀ with W the embedding [V, h].

Tying means one array, not two: the head registers the embedding's weight *and* its gradient buffer, so the
lookup's gradient and the head's gradient add up in one place (``Module.named_parameters`` lists it once).
Its parallel twin is ``tpsim.tp.lm_head.ParallelLMHead`` (vocab-parallel logits, f in front).
"""

from __future__ import annotations

import numpy as np

from tpsim.nn.embedding import Embedding
from tpsim.nn.linear import LinearCache, linear_backward_input, linear_backward_weight, linear_forward
from tpsim.nn.module import Module


class TiedLMHead(Module):
    def __init__(self, embedding: Embedding) -> None:
        super().__init__()
        # the arrays only: holding the Module itself would make it a child and rename its parameters
        self.params["weight"] = embedding.params["weight"]
        self.grads["weight"] = embedding.grads["weight"]

    def forward(self, h: np.ndarray) -> tuple[np.ndarray, LinearCache]:
        """``h: [..., dim]`` -> ``(logits [..., V], LinearCache(h, Wᵀ, False))``."""
        return linear_forward(h, self.params["weight"].T, None)

    def backward(self, dlogits: np.ndarray, cache: LinearCache) -> np.ndarray:
        """``dlogits: [..., V]`` -> ``dh: [..., dim]``; adds into the tied weight's gradient (W:
        ``Module.weight_grad``)."""
        self.weight_grad(self.add_weight_grads, dlogits, cache)
        return linear_backward_input(dlogits, cache)

    def add_weight_grads(self, dlogits: np.ndarray, cache: LinearCache) -> None:
        """W: ``dW += (hᵀ·dlogits)ᵀ`` ``[V, dim]``, into the buffer the embedding shares when tied."""
        dw_t, _ = linear_backward_weight(dlogits, cache)
        self.grads["weight"] += dw_t.T


class LMHead(TiedLMHead):
    """An untied output layer (Llama's ``lm_head``): its own ``weight: [V, dim]``, logits = h · weightᵀ.

    Stored like the embedding, rows = vocabulary (which is also torch's ``nn.Linear`` [out, in] layout).
    """

    def __init__(self, vocab_size: int, dim: int, *, rng: np.random.Generator | None = None, dtype=np.float64,
                 std: float = 0.02) -> None:
        Module.__init__(self)
        rng = np.random.default_rng(0) if rng is None else rng
        self.add_param("weight", rng.normal(0.0, std, size=(vocab_size, dim)).astype(dtype))
