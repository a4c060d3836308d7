"""Which tokens a context-parallel rank holds, and how much causal attention each then computes.

Contiguous: rank r of C holds positions [r·s/C, (r+1)·s/C). Under a causal mask its queries see every key before
them, so rank r computes about (2r + 1)·s²/(2C²) pairs — the last rank C − 1 about 2C − 1 times the first's, and
the ring waits for it. Load-balanced (TransformerEngine's DualChunkSwap, ring-flash-attention's
zigzag): the sequence in 2C chunks, rank r holding chunks r and 2C − 1 − r, one early and one late, so every
rank's queries see the same number of keys. ``causal_pairs`` counts the (query, key) pairs a rank computes
against the whole sequence — its attention FLOPs up to the constant 4·d per pair. Pure arithmetic, no MPI.
"""

from __future__ import annotations

import numpy as np

from tpsim.errors import ConfigError

LAYOUTS = ("zigzag", "contiguous")


def positions(layout: str, rank: int, cp: int, seq: int) -> np.ndarray:
    """The absolute positions rank ``rank`` of ``cp`` holds of a sequence of ``seq`` tokens, in order."""
    if layout not in LAYOUTS:
        raise ConfigError(f"context-parallel layout {layout!r}: one of {', '.join(LAYOUTS)}")
    parts = 2 * cp if layout == "zigzag" else cp
    if seq % parts:
        raise ConfigError(f"sequence length {seq} not divisible by {parts} ({layout} over cp {cp}"
                          + (": 2 x cp chunks" if layout == "zigzag" else "") + ")")
    size = seq // parts
    chunks = (rank, 2 * cp - 1 - rank) if layout == "zigzag" else (rank,)
    return np.concatenate([np.arange(c * size, (c + 1) * size) for c in chunks])


def causal_pairs(layout: str, rank: int, cp: int, seq: int) -> int:
    """(query, key) pairs rank ``rank`` computes under a causal mask: Σ over its positions p of p + 1."""
    return int((positions(layout, rank, cp, seq) + 1).sum())
