"""The check of exercise 13 (lesson 13, inference): the argmax of vocab-parallel logits, without gathering them."""

from __future__ import annotations

import numpy as np

from tpsim.generate.argmax import serial_argmax, tie_and_padding_logits
from tpsim.teach.checks.registry import exercise
from tpsim.teach.verdict import Report, describe_events


def argmax_symptoms(full: np.ndarray, vocab: int, start: int, width: int) -> dict:
    """What each typical slip returns on these logits, on the rank holding columns ``start .. start + width``."""
    local = full[:, start:start + width]
    real = np.where(start + np.arange(width) < vocab, local, -np.inf)
    reversed_first = vocab - 1 - np.argmax(full[:, :vocab][:, ::-1], axis=1)
    return {"your result is this rank's own best id: the other ranks' slices never took part":
                start + np.argmax(real, axis=1),
            "a local column number, not a vocabulary id: column c of this rank is id vocab_start + c":
                np.argmax(real, axis=1),
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
    for case, (b, vocab) in enumerate([(5, 4 * p + 3), (3, 2 * p), (1, p + 1)]):
        full = tie_and_padding_logits(case, b, vocab, p)
        width = full.shape[1] // p
        start = group.rank * width
        got = r.call("vocab_parallel_argmax", full[:, start:start + width].copy(), start, vocab, group)
        r.compare(f"vocab_parallel_argmax of {b} rows, vocabulary {vocab} (padded to {full.shape[1]})",
                  np.asarray(got), serial_argmax(full, vocab), tol=0.0,
                  symptoms=argmax_symptoms(full, vocab, start, width), layout="rows")
        small = all(e.op == "all_reduce" and int(np.prod(e.shape)) <= 2 * b for e in r.events)
        r.require(small and r.events, "communication",
                  f"the logits never travel: a few all_reduce calls of [b] = [{b}] numbers (one value and one id "
                  f"per row) are enough; yours issued {describe_events(r.events)}")
