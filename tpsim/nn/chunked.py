"""Elementwise chains in cache-sized pieces: the same operations, in the same order, on a slice at a time.

An elementwise formula written as NumPy in-place steps (``u = x·x; u *= x; u *= c; u += x; ...``) streams every
array through memory once per step. On a [2048, 1024] float32 activation (8 MiB) that is a dozen trips to L3
or DRAM for GeLU's backward — and with two ranks per core, both streaming while the other core's ranks run
GEMMs, it was the MLP's largest cost after the GEMMs and the all-reduces (measured: 14 ms of a 480 ms TP-4
step per rank, where the same work alone took 3.7 ms). Run on slices of ``CHUNK_BYTES``, the slice and its
scratch stay in L2 between the steps, so each element leaves and enters memory once.

Every element goes through exactly the operations it went through before, so the result is bit for bit what
the whole-array version gives (elementwise operations do not mix elements); only the number of NumPy calls
grows, by one set per slice.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

CHUNK_BYTES = 256 << 10  # the slice and 2–4 scratch slices of this size fit one core's 1–2 MiB of L2


def chunk_slices(n: int, itemsize: int, chunk_bytes: int = CHUNK_BYTES) -> Iterator[slice]:
    """Consecutive slices covering ``range(n)``, each at most ``chunk_bytes`` of ``itemsize``-byte elements."""
    step = max(1, chunk_bytes // itemsize)
    for start in range(0, n, step):
        yield slice(start, min(n, start + step))


def row_blocks(rows: int, row_bytes: int, chunk_bytes: int = CHUNK_BYTES) -> Iterator[slice]:
    """Consecutive slices of whole rows covering ``range(rows)``, each about ``chunk_bytes`` (at least one row):
    for row-wise formulas (softmax, normalisation) whose reductions must see a whole row at once."""
    step = max(1, chunk_bytes // max(1, row_bytes))
    for start in range(0, rows, step):
        yield slice(start, min(rows, start + step))


def row_views(*arrays: np.ndarray) -> Iterator[tuple[np.ndarray, ...]]:
    """The same blocks of whole rows of every array, as 2-D views ``[rows, last dim]``.

    The arrays share their leading shape (their last dims may differ: LayerNorm's ``rstd`` has one column), so
    row ``i`` of each is the same position; a block holds as many rows as fit the widest array's ``CHUNK_BYTES``.
    An array written through the views must be C-contiguous (else its reshape is a copy and the writes are lost);
    one only read may be any layout.
    """
    flat = [a.reshape(-1, a.shape[-1]) for a in arrays]
    widest = max(f.shape[1] * f.itemsize for f in flat)
    for rows in row_blocks(flat[0].shape[0], widest):
        yield tuple(f[rows] for f in flat)
