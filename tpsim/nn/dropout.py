"""Inverted dropout: zero each element with probability ``p`` and scale the survivors by ``1 / (1 − p)``.

    y = x · keep / (1 − p),     keep ~ Bernoulli(1 − p) elementwise,     dx = dy · keep / (1 − p)

Scaling at train time keeps ``E[y] = x``, so evaluation is the identity. The backward is the forward applied
to ``dy`` with the *same* mask, which is why the mask is the cache.

The mask is either drawn here from a generator or handed in ready-made (``keep=``). Tensor parallelism needs
the second form: dropout on a replicated activation must drop the same elements on every rank, while dropout
on a sharded one must drop different elements per shard, so an RNG tracker outside this file decides which
stream each mask comes from. ``DropoutPlan`` carries that decision through a forward: the tracker
(a ``tpsim.tp.random.DropoutRNG``), the step, and the global positions this rank holds, so the mask of any
site can be requested by *global* position and a sharded rank draws the serial model's bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from tpsim.kinds import ELEMENTWISE, marked
from tpsim.nn.module import Module
from tpsim.partition import Partition


class DropoutCache(NamedTuple):
    keep: np.ndarray | None  # bool [...], True where the element survived; None: the forward was the identity
    p: float


@marked(ELEMENTWISE)
def dropout_mask_apply(x: np.ndarray, keep: np.ndarray, p: float) -> np.ndarray:
    """``x: [...]``, boolean ``keep: [...]`` -> ``x · keep / (1 − p)``; serves forward and backward alike."""
    out = np.multiply(x, keep)  # then the scale in place: one buffer, not two
    out *= 1.0 / (1.0 - p)
    return out


def dropout_forward(x: np.ndarray, keep: np.ndarray | None, p: float) -> tuple[np.ndarray, DropoutCache]:
    """``x: [...]``, ``keep: bool [...]`` or None (no dropout) -> ``(y: [...], DropoutCache)``."""
    return (x if keep is None else dropout_mask_apply(x, keep, p)), DropoutCache(keep, p)


def dropout_backward(dy: np.ndarray, cache: DropoutCache) -> np.ndarray:
    """``dy: [...]`` -> ``dx: [...]``: the same mask, the same scale (the identity when there was no mask)."""
    return dy if cache.keep is None else dropout_mask_apply(dy, cache.keep, cache.p)


@dataclass(frozen=True)
class DropoutPlan:
    """Where dropout bits come from for one forward: the tracker, the step, the global rows held here."""

    rng: object | None = None  # a tpsim.tp.random.DropoutRNG; None = no dropout (evaluation)
    step: int = 0
    batch_index: np.ndarray | None = None  # global batch positions of the local rows (DP); None = all
    seq_partition: Partition | None = None  # SP: this rank's sequence positions (set by Transformer); None = all

    def rows(self, batch: int) -> np.ndarray:
        """The global batch positions of ``batch`` local rows: ``batch_index``, or ``0 .. batch − 1``."""
        rows = np.arange(batch) if self.batch_index is None else np.asarray(self.batch_index, dtype=np.int64)
        if rows.shape != (batch,):
            raise ValueError(f"batch_index holds {rows.size} positions for {batch} local rows")
        return rows


def replicated_dropout(x: np.ndarray, p: float, key: str, plan: DropoutPlan) -> tuple[np.ndarray, DropoutCache]:
    """Dropout on a replicated activation ``x: [b, s, h]``: every TP rank draws the same bits.

    Under sequence parallelism ``x`` is [b, s/p, h] at the positions ``plan.seq_partition`` names: the mask
    request gives those global positions, so the exact RNG draws the serial model's bits for them, and region
    "partitioned" (Megatron forks its model-parallel RNG for dropout in SP regions).
    """
    if p == 0.0 or plan.rng is None:
        return dropout_forward(x, None, p)
    rows = plan.rows(x.shape[0])
    seq = plan.seq_partition
    positions, s = (slice(None), x.shape[1]) if seq is None else (seq.index, seq.full)
    keep = plan.rng.keep_mask(p, key=key, step=plan.step, global_shape=(int(rows.max()) + 1, s, x.shape[2]),
                              index=(rows, positions, slice(None)),
                              region="replicated" if seq is None else "partitioned")
    return dropout_forward(x, keep, p)


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
    ) -> tuple[np.ndarray, DropoutCache]:
        """``x: [...]`` -> ``(y: [...], DropoutCache)``; identity (mask None) when ``p == 0`` or not training."""
        if self.p == 0.0 or not training:
            return dropout_forward(x, None, self.p)
        if keep is None:
            keep = (self.rng if rng is None else rng).random(x.shape) >= self.p
        else:
            keep = np.asarray(keep)
            if keep.shape != x.shape:
                raise ValueError(f"keep mask has shape {keep.shape}, input has shape {x.shape}")
            if keep.dtype != np.bool_:
                raise TypeError(f"keep mask must be boolean, got dtype {keep.dtype}")
        return dropout_forward(x, keep, self.p)

    def backward(self, dout: np.ndarray, cache: DropoutCache) -> np.ndarray:
        return dropout_backward(dout, cache)

    def __repr__(self) -> str:
        return f"Dropout(p={self.p})"
