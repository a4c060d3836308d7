"""The permutations of a token dispatch, pure index arithmetic (no MPI).

A rank routes its T tokens; each kept (token, choice) pair is an *assignment*. Sent rows are laid out
**expert-major** (expert 0's assignments in token order, then expert 1's, ...), so the rows for EP rank j — its
experts are consecutive — form one contiguous block: the all-to-all-v's piece for j. What a rank receives is
**source-major** (source 0's rows for each of its local experts, then source 1's, ...); to run an expert over
all its rows at once they are *regrouped* expert-major, and the outputs regrouped back before they return.

    counts [A, B] (A sources, B local experts): rows laid A-major   ->  regroup(counts): the B-major order
"""

from __future__ import annotations

import numpy as np


def regroup(counts: np.ndarray) -> np.ndarray:
    """The permutation ``p`` with ``rows[p]`` listing the blocks of an A-major layout (block (a, b) holds
    ``counts[a, b]`` rows) B-major; ``out[p] = rows_b_major`` undoes it."""
    counts = np.asarray(counts, dtype=np.int64)
    flat = counts.ravel()
    starts = (np.cumsum(flat) - flat).reshape(counts.shape)
    pieces = [np.arange(starts[a, b], starts[a, b] + counts[a, b])
              for b in range(counts.shape[1]) for a in range(counts.shape[0])]
    return np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, dtype=np.int64)


def expert_major(rows: list, slots: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-expert (token rows, choice slots) -> ``(tokens, slots, counts)`` laid expert-major."""
    counts = np.array([len(r) for r in rows], dtype=np.int64)
    tokens = np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, dtype=np.int64)
    return tokens, np.concatenate(slots).astype(np.int64), counts


def scatter_weighted(y: np.ndarray, tokens: np.ndarray, counts: np.ndarray, rows: np.ndarray,
                     w: np.ndarray | None) -> None:
    """``y[t] += w · row`` expert by expert (within one expert a token appears once: a plain indexed add, in the
    serial layer's order); ``w`` None: unweighted (the input gradients' way back)."""
    start = 0
    for n in counts:
        t, piece = tokens[start:start + n], rows[start:start + n]
        y[t] += piece if w is None else w[start:start + n, None] * piece
        start += n
