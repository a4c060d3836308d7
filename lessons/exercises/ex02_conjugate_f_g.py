"""Exercise 02 — the backward of f and g (lesson 02_conjugate_f_g.py).

The forwards are given. Write the two backwards with the traced collectives of ``group`` (a ``tpsim.comm.Group``:
``group.all_reduce(x)`` sums ``x`` over the ranks and returns the sum on every rank).
Check it on real ranks:   tpsim check 02           (2 ranks, random gradients, collectives counted)
Stuck?                    tpsim check 02 --hint    (one hint more each time)
The reference answer: tpsim lesson solution 02 (prints where it is) — try first.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group


def f_forward(x: np.ndarray, group: Group) -> np.ndarray:
    """f, "copy to the tensor-parallel region": the identity; every rank already holds the whole ``x``."""
    return x


def g_forward(y_partial: np.ndarray, group: Group) -> np.ndarray:
    """g, "reduce from the tensor-parallel region": the sum of the ranks' partial results, on every rank."""
    return group.all_reduce(y_partial)


def f_backward(dy: np.ndarray, group: Group) -> np.ndarray:
    """``dy: [...]``, this rank's gradient with respect to f's output -> ``dx: [...]``, the same on every rank.

    After f, each rank used x in its own branch of the computation, so each ``dy`` holds only the part of the
    gradient that flowed back through that rank's branch: **a different dy on every rank** (the check feeds
    each rank its own random dy).
    """
    # TODO: one collective (the lesson says which one, and why).
    raise NotImplementedError


def g_backward(dy: np.ndarray, group: Group) -> np.ndarray:
    """``dy: [...]``, the gradient with respect to g's output -> the gradient with respect to this rank's
    ``y_partial``.

    g's output is replicated and what follows it is computed alike on every rank, so **dy is the same on every
    rank** (the check feeds every rank the same random dy, as training would).
    """
    # TODO: how does a sum's output change when one of its terms changes?
    raise NotImplementedError
