"""Inverted dropout: zero each element with probability ``p`` and scale the survivors by ``1 / (1 − p)``.

    y = x · keep / (1 − p),     keep ~ Bernoulli(1 − p) elementwise,     dx = dy · keep / (1 − p)

Scaling at train time keeps ``E[y] = x``, so evaluation is the identity. The backward is the forward applied
to ``dy`` with the *same* mask, which is why the mask is the cache.

The mask is either drawn here from a generator or handed in ready-made (``keep=``). Tensor parallelism needs
the second form: dropout on a replicated activation must drop the same elements on every rank, while dropout
on a sharded one must drop different elements per shard, so an RNG tracker outside this file decides which
stream each mask comes from.
"""

from __future__ import annotations

import numpy as np

from tpsim.nn.module import Module


def dropout_mask_apply(x: np.ndarray, keep: np.ndarray, p: float) -> np.ndarray:
    """``x: [...]``, boolean ``keep: [...]`` -> ``x · keep / (1 − p)``; serves forward and backward alike."""
    return x * keep * (1.0 / (1.0 - p))


class Dropout(Module):
    """Inverted dropout with drop probability ``p`` in ``[0, 1)``; no parameters.

    ``rng`` is this layer's own generator, used only when ``forward`` gets neither ``keep`` nor ``rng``.
    """

    def __init__(self, p: float = 0.0, *, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = float(p)
        self.rng = np.random.default_rng(0) if rng is None else rng

    def forward(
        self,
        x: np.ndarray,
        *,
        keep: np.ndarray | None = None,
        rng: np.random.Generator | None = None,
        training: bool = True,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """``x: [...]`` -> ``(y: [...], cache = keep mask or None)``; identity when ``p == 0`` or not training."""
        if self.p == 0.0 or not training:
            return x, None
        if keep is None:
            keep = (self.rng if rng is None else rng).random(x.shape) >= self.p
        else:
            keep = np.asarray(keep)
            if keep.shape != x.shape:
                raise ValueError(f"keep mask has shape {keep.shape}, input has shape {x.shape}")
            if keep.dtype != np.bool_:
                raise TypeError(f"keep mask must be boolean, got dtype {keep.dtype}")
        return dropout_mask_apply(x, keep, self.p), keep

    def backward(self, dout: np.ndarray, cache: np.ndarray | None) -> np.ndarray:
        if cache is None:  # the forward was the identity
            return dout
        return dropout_mask_apply(dout, cache, self.p)

    def __repr__(self) -> str:
        return f"Dropout(p={self.p})"
