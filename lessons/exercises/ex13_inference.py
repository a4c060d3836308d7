"""Exercise 13 — greedy decoding's argmax over a vocab-parallel LM head (lesson 13_inference.py).

Under TP each rank holds the logits of its vocabulary slice only: ``logits_local`` is ``[b, Vp/p]``, column
c being vocabulary id ``vocab_start + c``; ids ``>= vocab_size`` are padding, there so that Vp divides by p:
zero rows of the weight, so their logit is 0 (or anything) — they are not words and must never win, not even
in a row whose real logits are all negative. Return the id of the largest logit of each row over the *whole*
real vocabulary, the same on every rank, as ``np.argmax(full[:, :vocab_size])`` would (ties, within a rank or
across ranks: the first id) — without gathering the logits: use ``group``'s traced
``all_reduce(x, op="sum" | "max" | "min")``.
Check it:   tpsim check 13           (4 ranks)
The reference answer: tpsim lesson solution 13 (prints where it is) — try first.
"""

from __future__ import annotations

import numpy as np  # noqa: F401 - you will need it


def vocab_parallel_argmax(logits_local, vocab_start: int, vocab_size: int, group):
    """``logits_local: [b, Vp/p]`` -> ``int64 [b]``: the global argmax over the real vocabulary, on every rank."""
    # TODO: a (value, global id) pair per row from this rank's slice, then two all-reduces of [b].
    raise NotImplementedError
