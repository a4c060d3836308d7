"""Exercise 20 — context parallelism by hand: the online-softmax merge, the zigzag layout, the ring's bytes
(lesson 20_context_parallelism.py).

Plain arithmetic on every rank: no collective, no group. Shapes as in ``tpsim.cp.blocks``: a partial attention
``out`` is ``[b, heads, L, d]`` (L queries of this rank), its log-sum-exp ``lse`` is ``[b, heads, L]``. The check
builds two partial attentions of the same queries over two disjoint blocks of keys (each rank its own queries;
the scores once as they come and once ×1000-sized), cuts sequences over cp = 2, 3, 4 and 8 ranks, and prices
ring attention at several sizes, grouped-query attention among them; then, when every answer is right, it
holds them to a live ring over the 4 ranks.
Check it:   tpsim check 20           (4 ranks)
The reference answer: tpsim lesson solution 20 (prints where it is) — try first.
"""

from __future__ import annotations

import numpy as np


def merge_partials(out_a: np.ndarray, lse_a: np.ndarray, out_b: np.ndarray,
                   lse_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(out, lse)``: the attention of the queries over the keys of both blocks, from each block's partial
    ``out`` (already normalised over its own keys) and ``lse`` = log Σ exp(scores) over its own keys.

    A side may have lse = −∞ for a row (that query sees no key of that block: it is causal), never both. The
    scores can be large (×1000): nothing may overflow."""
    # TODO: the SenseParrots article's parallel softmax: a global max, a global sum of exponentials, each part
    # rescaled to them.
    raise NotImplementedError


def zigzag_chunks(rank: int, cp: int) -> tuple[int, int]:
    """The two chunks (numbered 0 … 2·cp − 1 along the sequence) that ``rank`` of ``cp`` holds under the
    load-balanced layout, the earlier chunk first: one early and one late, so that every rank's queries see as
    many keys under the causal mask."""
    # TODO: pair an early chunk with the late one that balances it.
    raise NotImplementedError


def ring_bytes(cp: int, b: int, s: int, heads: int, kv_heads: int, head_dim: int, e: int) -> int:
    """The bytes one rank sends in one attention layer's forward under ring attention: ``b`` rows of ``s``
    tokens cut over ``cp`` ranks, ``heads`` query heads and ``kv_heads`` key/value heads of ``head_dim``, ``e``
    bytes an element."""
    # TODO: what travels round the ring, how big is one block, and how many steps does a block take?
    raise NotImplementedError
