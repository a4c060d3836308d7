"""Exercise 06 — the parallel softmax's three reductions (lesson 06_vocab_parallel_cross_entropy.py).

Check it on real ranks:   tpsim check 06           (4 ranks, logits up to ×1000, collectives counted)
The reference answer: tpsim lesson solution 06 (prints where it is) — try first.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group


def vocab_parallel_nll(logits_local: np.ndarray, targets: np.ndarray, vocab_start: int,
                       group: Group) -> np.ndarray:
    """Per-token cross-entropy ``loss_i = log Σ_c exp(z_ic) − z_i,t_i`` without gathering the logits.

    ``logits_local: [tokens, V/p]``  this rank's vocabulary columns ``vocab_start … vocab_start + V/p − 1``
    ``targets: [tokens]``            the target id of every token (replicated), anywhere in ``[0, V)``
    Returns ``loss: [tokens]``, the same on every rank. Allowed: three ``group.all_reduce`` calls of
    ``[tokens]`` elements (``op="max"`` or ``op="sum"``); the logits can be ×1000, so mind the overflow.
    """
    # TODO (the SenseParrots article, eqs. (3)(4)): eq. (4), the global max; then eq. (3)'s Σ exp(z − max);
    # then the target's logit, from the rank that owns it.
    raise NotImplementedError
