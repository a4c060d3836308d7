"""Exercise 05 — which columns of c_attn a rank holds (lesson 05_parallel_attention.py).

Check it on real ranks:   tpsim check 05           (4 ranks, several sizes)
Stuck?                    tpsim check 05 --hint    (one hint more each time)
The reference answer: tpsim lesson solution 05 (prints where it is) — try first.
"""

from __future__ import annotations

import numpy as np


def qkv_columns(hidden: int, heads: int, tp: int, tp_rank: int) -> np.ndarray:
    """The master columns of ``c_attn.weight: [hidden, 3·hidden]`` that rank ``tp_rank`` of ``tp`` holds.

    The layout is GPT-2's (Hugging Face's ``c_attn``, tpsim's): three contiguous parts ``[q | k | v]``, each
    ``hidden`` columns wide — q is columns ``0 … hidden − 1``, k ``hidden … 2·hidden − 1``, v the rest. Inside
    each part, head j owns the block ``j·hd … (j+1)·hd − 1`` (``hd = hidden / heads``). (Megatron-LM stores
    its fused qkv interleaved per head instead, ``[heads, 3, hd]``: head 0's q, k, v, then head 1's, … — a
    different split, which is why checkpoint converters permute columns. Not this one.)

    Rank ``tp_rank`` runs heads ``tp_rank·heads/tp … (tp_rank+1)·heads/tp − 1``. Return their columns as
    one int array of ``3·hidden/tp`` indices in this order: first all of its heads' q columns (ascending), then
    all of their k columns, then all of their v columns — so the rank's local shard is again ``[q | k | v]``.
    (Assume ``heads`` divides by ``tp``.)
    """
    # TODO: not a contiguous block of the 3·hidden columns — see the lesson's layout trap.
    raise NotImplementedError
