"""Exercise 08 — average the gradients over the data-parallel group (lesson 08_data_times_tensor_parallel.py).

Check it on real ranks:   tpsim check 08           (8 ranks = TP 4 × DP 2)
The reference answer: tpsim lesson solution 08 (prints where it is) — try first.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group


def average_gradients(grads: list[np.ndarray], dp_group: Group) -> None:
    """Replace every gradient, in place, by its mean over the ranks of ``dp_group``.

    ``grads``: this rank's gradients (its TP shards), any shapes, float64. ``dp_group`` holds the ranks with
    the same shards in the other replicas. Afterwards every rank of the DP group holds the same numbers:
    ``(1/dp) · Σ_dp grad``. Write into the given arrays — the optimizer holds them. DDP packs them into
    buckets so that one message carries many; ``np.concatenate`` of the ravelled grads makes one.
    """
    # TODO: all-reduce (sum) over dp_group, divide by dp_group.size, write the result back in place.
    raise NotImplementedError
