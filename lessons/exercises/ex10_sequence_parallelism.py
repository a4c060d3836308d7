"""Exercise 10 — ḡ, the reduce-scatter into the sequence-parallel region (lesson 10_sequence_parallelism.py).

Activations are ``[batch, seq, hidden]``: the sequence is **axis 1**. Use the traced collectives of ``group`` (a
``tpsim.comm.Group``): ``group.reduce_scatter(x, axis)`` sums ``x`` over the ranks and hands rank r chunk r of
``axis``; ``group.all_gather(x, axis)`` lays every rank's ``x`` side by side along ``axis``, in rank order.
Check it on real ranks:   tpsim check 10           (4 ranks; values, collectives and bytes on the wire)
The reference answer: tpsim lesson solution 10 (prints where it is) — try first.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group


def g_bar_forward(partial: np.ndarray, group: Group) -> np.ndarray:
    """ḡ's forward, after a row-parallel linear.

    ``partial: [b, s, h]``, this rank's partial sum of the layer's output (the true output is the sum over the
    ranks). Returns ``[b, s/p, h]``: the summed output at this rank's positions ``r·s/p … (r+1)·s/p − 1``,
    with one collective and no more bytes on the wire than it needs.
    """
    # TODO: sum over the ranks, keep this rank's block of positions.
    raise NotImplementedError


def g_bar_backward(dy_shard: np.ndarray, group: Group) -> np.ndarray:
    """ḡ's backward. ``dy_shard: [b, s/p, h]``, the gradient of this rank's positions of ḡ's output.

    Returns ``[b, s, h]``: the gradient with respect to this rank's ``partial``. Every term of a sum receives the
    sum's gradient, so each rank needs the gradient of *every* position — and each rank holds s/p of them.
    """
    # TODO: one collective (lesson 10 says which, and why it is f̄'s forward).
    raise NotImplementedError
