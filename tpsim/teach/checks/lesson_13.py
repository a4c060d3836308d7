"""The check of exercise 13 (lesson 13, inference): the argmax of vocab-parallel logits, without gathering them.

The logits are ``tie_and_padding_logits``: ties within a rank, across ranks and across every rank, an all-negative
row, padding columns above every real logit — and one case whose padding logits are exactly 0, what a zero row
of the weight gives, beside the all-negative row. Each typical slip is a symptom, computed on the same logits:
this rank alone, a local column instead of an id (with or without the reductions), padding that wins (unmasked,
or masked to 0), ties to the largest id (reversed per rank, or each rank's first id and then a MAX over them).
"""

from __future__ import annotations

import numpy as np

from tpsim.generate.argmax import serial_argmax, tie_and_padding_logits
from tpsim.teach.checks.registry import exercise
from tpsim.teach.verdict import Report, describe_events


def argmax_cases(p: int) -> list[tuple[int, np.ndarray]]:
    """``(vocab_size, full padded logits [b, Vp])`` of each case the check runs on ``p`` ranks."""
    cases = []
    for case, (b, vocab) in enumerate([(5, 4 * p + 3), (3, 2 * p), (1, p + 1), (4, 3 * p + 1)]):
        full = tie_and_padding_logits(case, b, vocab, p)
        if case == 3:  # padding logits exactly 0 (zero rows of the weight) beside an all-negative real row
            full[:, vocab:] = 0.0
        cases.append((vocab, full))
    return cases


def rank_bests(full: np.ndarray, vocab: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's (maximum, first local column reaching it) over its real columns: ``[p, b]`` each."""
    width = full.shape[1] // p
    real = np.where(np.arange(full.shape[1]) < vocab, full, -np.inf).reshape(full.shape[0], p, width)
    return real.max(axis=2).T, np.argmax(real, axis=2).T


def argmax_symptoms(full: np.ndarray, vocab: int, start: int, width: int) -> dict:
    """What each typical slip returns on these logits, on the rank holding columns ``start .. start + width``."""
    local = full[:, start:start + width]
    real = np.where(start + np.arange(width) < vocab, local, -np.inf)
    reversed_first = vocab - 1 - np.argmax(full[:, :vocab][:, ::-1], axis=1)
    best, column = rank_bests(full, vocab, full.shape[1] // width)
    reached = best == best.max(axis=0)  # [p, b]: the ranks whose maximum is the row's
    first_ids = column + width * np.arange(best.shape[0])[:, None]  # each rank's first id of its maximum
    return {"your result is this rank's own best id: the other ranks' slices never took part":
                start + np.argmax(real, axis=1),
            "a local column number, not a vocabulary id: column c of this rank is id vocab_start + c":
                np.argmax(real, axis=1),
            "the ranks' reductions compared local column numbers: each rank sent its column c, not the "
            "vocabulary id vocab_start + c, so columns of different slices were taken for the same id":
                np.where(reached, column, vocab).min(axis=0),
            "ties across ranks went to the last rank that reached the maximum: each rank's first id is right, "
            "but a MAX over the ranks' ids picks the largest of them; np.argmax takes the first":
                np.where(reached, first_ids, -1).max(axis=0),
            "a padding column won: ids >= vocab_size are zero rows of the weight, not words":
                np.argmax(full, axis=1),
            "padding columns were set to 0, not −inf: where every real logit is negative, a padding id wins":
                np.argmax(np.where(np.arange(full.shape[1]) < vocab, full, 0.0), axis=1),
            "ties went to the largest id; np.argmax (and serial decoding) takes the first": reversed_first}


@exercise("13", "vocab_parallel_argmax",
          vocab_parallel_argmax=("the largest logit of the whole row is the largest of every rank's largest: what "
                                 "does one rank need to send so that the others can tell who won, and where?",
                                 "reduce this rank's slice to one (value, global id) pair per row — padding "
                                 "columns (id >= vocab_size) count as −inf — then two all-reduces of [b]",
                                 "MAX of the local maxima; then MIN over the ranks of (my global id if my maximum "
                                 "equals the global one, else vocab_size): the smallest id that reaches the "
                                 "maximum, as np.argmax picks the first"))
def check_13(r: Report) -> None:
    group = r.grid().tp_group
    p = group.size
    for vocab, full in argmax_cases(p):
        b, width = full.shape[0], full.shape[1] // p
        start = group.rank * width
        got = r.call("vocab_parallel_argmax", full[:, start:start + width].copy(), start, vocab, group)
        r.compare(f"vocab_parallel_argmax of {b} rows, vocabulary {vocab} (padded to {full.shape[1]})",
                  got, serial_argmax(full, vocab), tol=0.0,
                  symptoms=argmax_symptoms(full, vocab, start, width), layout="rows")
        small = all(e.op == "all_reduce" and int(np.prod(e.shape)) <= 2 * b for e in r.events)
        r.require(small and r.events, "communication",
                  f"the logits never travel: a few all_reduce calls of [b] = [{b}] numbers (one value and one id "
                  f"per row) are enough; yours issued {describe_events(r.events)}")
