"""Exercise 03 — the forward of a row-parallel linear layer, given its shard (lesson 03_column_row_parallel.py).

Check it on real ranks:   tpsim check 03           (4 ranks; compared with tpsim's RowParallelLinear)
The reference answer: tpsim lesson solution 03 (prints where it is) — try first.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group


def row_parallel_forward(y_shard: np.ndarray, weight_shard: np.ndarray, bias: np.ndarray,
                         group: Group) -> np.ndarray:
    """``z = y · B + b`` with ``B: [in, out]`` split by rows over ``group`` (``input_is_parallel=True``).

    ``y_shard: [tokens, in/p]``   this rank's columns of the input y (what a column-parallel layer left here)
    ``weight_shard: [in/p, out]`` this rank's rows of B
    ``bias: [out]``               replicated: the same full bias on every rank
    Returns ``z: [tokens, out]``, the same on every rank. ``group.all_reduce(x)`` sums over the ranks.
    """
    # TODO: eq. (2) of lesson 01, on real ranks — and mind where the bias goes.
    raise NotImplementedError
