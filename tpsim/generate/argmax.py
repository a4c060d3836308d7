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

from tpsim.partition import padded_vocab_size


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


def tie_and_padding_logits(seed: int, b: int, vocab: int, p: int) -> np.ndarray:
    """Full padded logits ``[b, Vp]`` that real models almost never produce, for checking the two rules above:
    small integers (many ties, some across ranks), an all-tied row, a row whose first and last real ids tie, a
    row whose real logits are all negative, and padding columns larger than any real logit (they must never
    win, not even against a negative row: padding counts as −∞, not as 0)."""
    rng = np.random.default_rng([13, seed])
    full = rng.integers(-3, 4, (b, padded_vocab_size(vocab, p))).astype(np.float64)
    full[0] = 2.0
    if b > 1:
        full[1, 0] = full[1, vocab - 1] = 9.0
    if b > 2:
        full[2] = -1.0 - rng.integers(0, 3, full.shape[1])
    full[:, vocab:] = 50.0
    return full


def check_tie_rules(group, vocab_size: int, rows: int = 5) -> tuple[bool, str]:
    """``vocab_parallel_argmax`` of ``tie_and_padding_logits`` over ``group`` against ``serial_argmax`` of the
    whole rows: real models' logits almost never tie or lose to padding, so a decode can pass its checks with a
    broken tie or padding rule; these rows make both decide. Collective over ``group`` (2 all-reduces of [rows])."""
    full = tie_and_padding_logits(0, rows, vocab_size, group.size)
    width = full.shape[1] // group.size
    start = group.rank * width
    got = vocab_parallel_argmax(full[:, start:start + width], start, vocab_size, group)
    want = serial_argmax(full, vocab_size)
    ok = bool(np.array_equal(got, want))
    return ok, (f"tie and padding rules: TP({group.size}) argmax of {rows} crafted rows (ties within and across "
                f"ranks, an all-negative row, padding logits above every real one) "
                f"{'equals' if ok else f'differs from: {got.tolist()} vs'} np.argmax {want.tolist()}")
