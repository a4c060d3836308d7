"""Reference answer to exercise 10 — ḡ's forward and backward (lesson 10_sequence_parallelism.py)."""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group

SEQ_AXIS = 1  # [batch, seq, hidden]


def g_bar_forward(partial: np.ndarray, group: Group) -> np.ndarray:
    # the first half of an all-reduce: sum, and keep my s/p positions — (p−1)/p of the bytes on the wire
    return group.reduce_scatter(partial, axis=SEQ_AXIS)


def g_bar_backward(dy_shard: np.ndarray, group: Group) -> np.ndarray:
    # every partial sum gets the gradient of the whole output; each rank holds s/p positions of it: all-gather
    return group.all_gather(dy_shard, axis=SEQ_AXIS)
