"""Exercise 06b (harder) — the vocab-parallel cross-entropy's backward (lesson 06_vocab_parallel_cross_entropy.py).

Exercise 06 computed ``loss_i = log Z_i − z_i,t_i`` with each rank holding V/p of the vocabulary columns, three
all-reduces of [tokens] (the SenseParrots article's eqs. (3) and (4)). The training loss is the mean over the
N tokens, ``L = (1/N) Σ_i loss_i``. Now its gradient with respect to this rank's logits.

For lesson 06 (a paragraph it could point to): ``∂L/∂z_i,c = (softmax_i,c − [c = t_i]) / N``. A rank needs
only ``log Z_i`` from the forward — already the same on every rank — to get its own columns of the softmax,
``exp(z_i,c − log Z_i)``; the −1 belongs to the one rank that owns column t_i. The max's all-reduce needs no
backward at all: subtracting any constant m from every logit leaves the loss unchanged (it cancels between
log Z and z_t), so the loss does not depend on m, and its gradient through m is zero.

Check it on real ranks:   tpsim check 06b          (4 ranks, logits up to ×1000, collectives counted)
Stuck?                    tpsim check 06b --hint   (one hint more each time)
The reference answer: tpsim lesson solution 06b (prints where it is) — try first.
"""

from __future__ import annotations

import numpy as np


def vocab_parallel_nll_backward(logits_local: np.ndarray, targets: np.ndarray, vocab_start: int,
                                log_z: np.ndarray) -> np.ndarray:
    """``∂L/∂logits_local`` for the mean loss ``L = (1/N) Σ_i (log Z_i − z_i,t_i)``, N = ``len(targets)``.

    ``logits_local: [N, V/p]``  this rank's vocabulary columns ``vocab_start … vocab_start + V/p − 1``
    ``targets: [N]``            the target id of every token (replicated), anywhere in ``[0, V)``
    ``log_z: [N]``              ``log Σ_c exp(z_i,c)`` over the whole vocabulary, from the forward (replicated)
    Returns ``[N, V/p]``. No communication: everything this rank needs is here.
    """
    # TODO: softmax on this rank's columns, the −1 where this rank owns the target, the mean's 1/N.
    raise NotImplementedError
