"""Exercise 05 — which columns of c_attn a rank holds (lesson 05_parallel_attention.py).

Check it on real ranks:   tpsim check 05           (4 ranks, several sizes)
The reference answer is in lessons/solutions/ex05_parallel_attention.py — try first.
"""

from __future__ import annotations

import numpy as np


def qkv_columns(hidden: int, heads: int, tp: int, tp_rank: int) -> np.ndarray:
    """The master columns of ``c_attn.weight: [hidden, 3·hidden]`` that rank ``tp_rank`` of ``tp`` holds.

    The 3·hidden columns are laid out q | k | v (GPT-2); head j of q is columns ``j·hd … (j+1)·hd − 1``,
    ``hd = hidden / heads``, and the same j-th block of k and of v. Rank ``tp_rank`` runs heads
    ``tp_rank·heads/tp … (tp_rank+1)·heads/tp − 1`` and needs their q, k and v columns, in that order.
    Returns an int array of ``3·hidden/tp`` column indices. (Assume ``heads`` divides by ``tp``.)
    """
    # TODO: not a contiguous block of the 3·hidden columns — see the lesson's layout trap.
    raise NotImplementedError
