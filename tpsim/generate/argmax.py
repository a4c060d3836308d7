"""The argmax of a vocab-parallel LM head without gathering the logits.

Under TP rank r holds the logits of its vocabulary slice ``[vocab_start, vocab_start + Vp/p)`` only
(``tpsim.tp.lm_head``). Greedy decoding needs the index of the largest logit over the whole vocabulary, on every
rank. Gathering ``[b, V]`` logits would move V numbers per sequence per token; instead each rank reduces its own
slice to one (value, global index) pair, and two traced all-reduces of ``[b]`` finish the job:

    local:   m_r = max over my real columns,  i_r = vocab_start + argmax      (padding columns count as −∞)
    1.  m   = all_reduce(m_r, op="max")                                        the winning value
    2.  i   = all_reduce(i_r if m_r == m else V, op="min")                     the first index that reaches it

Taking the *smallest* index among ranks that reach the maximum gives exactly ``np.argmax`` of the full row (which
returns the first maximum), so ties break as in serial decoding. Bytes: 2 × b numbers, whatever V is.
"""

from __future__ import annotations

import numpy as np


def local_argmax(logits_local: np.ndarray, vocab_start: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``logits_local: [b, Vp/p]`` -> ``(max [b], global index int64 [b])`` over this rank's real vocabulary ids.

    Columns whose global id is ``>= vocab_size`` are padding (zero rows of the weight, logit 0): they must never
    win, so they count as −∞.
    """
    ids = vocab_start + np.arange(logits_local.shape[-1])
    masked = np.where(ids < vocab_size, logits_local, -np.inf)
    j = np.argmax(masked, axis=-1)
    return np.take_along_axis(masked, j[:, None], axis=-1)[:, 0], (vocab_start + j).astype(np.int64)


def vocab_parallel_argmax(logits_local: np.ndarray, vocab_start: int, vocab_size: int, group) -> np.ndarray:
    """The global argmax ``int64 [b]`` of vocab-parallel logits, the same on every rank of ``group``.

    Two all-reduces of ``[b]``: max of the values, then min of the indices of the ranks that reached it.
    """
    value, index = local_argmax(logits_local, vocab_start, vocab_size)
    best = group.all_reduce(value, op="max")
    candidate = np.where(value == best, index, np.int64(vocab_size))
    return group.all_reduce(candidate, op="min")


def serial_argmax(logits: np.ndarray, vocab_size: int) -> np.ndarray:
    """The reference: ``np.argmax`` over the real vocabulary of full logits ``[b, V]``."""
    return np.argmax(logits[:, :vocab_size], axis=-1).astype(np.int64)
