"""Sequence parallelism's collectives beside their GEMMs, chunk by chunk: the "collective matmul" of Wang et al.
(2023, ASPLOS, "Overlap Communication with Dependent Computation via Decomposition"), Megatron's
``--tp-comm-overlap``.

Under SP a column-parallel layer all-gathers its [b, s/t, in] input along the sequence (f̄) and then multiplies;
a row-parallel layer multiplies and then reduce-scatters the partial [b, s, out] output (ḡ). Both GEMMs act on
each sequence position alone, so they split into t chunks of s/t positions — chunk j the positions of rank j:

    gather_matmul     x_j·W for every chunk j of all_gather(x_r)      (f̄ forward; ḡ backward: dz_j·Bᵀ)
                      own chunk first, then the chunk from rank r−k at step k = 1 .. t−1
    matmul_scatter    Σ_ranks y_j·W for this rank's chunk j = r       (ḡ forward; f̄ backward: dy_j·Wᵀ)
                      the chunk for rank r+k computed and sent at step k, own chunk last, the t chunks then
                      added in group-rank order (``tpsim.comm.ordered``)

``overlap=True``: the chunks move as t − 1 steps of non-blocking point-to-point messages, each step recorded
(``Group.take_chunk``: the chunk's bytes, the GEMMs' shapes), while the GEMM of a chunk already here runs;
``overlap=False``: one blocking all-gather (or all-to-all) moves them all first. **The GEMMs are the same in
both**: per chunk, on a contiguous [b, s/t, k] block. That is what makes the two bit-identical: OpenBLAS's
result for a row of a matmul depends on how many rows the call has — measured here (numpy 2.4, one thread, t
of 2, 4, 8): one [m, k] GEMM against t GEMMs of m/t rows differed in 7,206 of 16,200 shapes tried; a second
sweep by chunk size found float32 chunks of every size tried but 12, 24 and 48 rows differing, float64 chunks
of 1, 2, 3 and 6 rows — so the blocking path runs the very calls the overlapped one does. The reduce-scatter's sum is this rank's own, in rank order, in both — an MPI
reduction adds in its algorithm's order, which changes with p and the message size.

The weight gradient dW = xᵀ·dy sums over the rows the re-gather delivers: split into chunks its rounding would
change, so that all-gather stays blocking (Megatron hides it behind the dX GEMM instead). Shapes use the
batch-first layout of ``tpsim.tp.sequence_parallel`` (sequence axis 1).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tpsim.comm import Group
from tpsim.comm.ordered import sum_in_rank_order
from tpsim.kinds import MATMUL, marked
from tpsim.nn.precision import matmul
from tpsim.tp.sequence_parallel import SEQ_AXIS, check_sequence_length

GATHER_TAG, SCATTER_TAG = 7101, 7102  # the TP communicator carries no other point-to-point message


@marked(MATMUL)
def times(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x [..., k] · w [k, n] -> [..., n]`` as one [rows, k] GEMM (16-bit: ``tpsim.nn.precision.matmul``)."""
    return matmul(x.reshape(-1, w.shape[0]), w).reshape(*x.shape[:-1], w.shape[1])


def chunk(x: np.ndarray, j: int, size: int) -> np.ndarray:
    """Positions [j·size, (j+1)·size) of ``x [b, s, ...]`` as a contiguous [b, size, ...] array."""
    return np.ascontiguousarray(x[:, j * size:(j + 1) * size])


def gemm_shapes(rows: int, weights: Sequence[np.ndarray]) -> tuple[tuple[int, int, int], ...]:
    """``(m, n, k)`` of ``[rows, k] · w [k, n]`` for each weight (what a record's ``gemms`` says)."""
    return tuple((rows, w.shape[1], w.shape[0]) for w in weights)


def gather_matmul(x_r: np.ndarray, weights: Sequence[np.ndarray], group: Group, *, overlap: bool,
                  keep_gathered: bool = False):
    """``all_gather(x_r)·W_i`` for every weight: ``x_r [b, s/t, k]`` -> ``[b, s, n_i]`` each, chunk by chunk
    (module docstring); ``keep_gathered``: also return the gathered ``[b, s, k]`` (ḡ backward needs dz whole)."""
    t, r, c = group.size, group.rank, x_r.shape[SEQ_AXIS]
    x_r = np.ascontiguousarray(x_r)
    gemms = gemm_shapes(x_r.shape[0] * c * t, weights)
    pieces: list = [None] * t
    if overlap and t > 1:
        sends = [group.post_chunk(x_r, (r + k) % t, GATHER_TAG) for k in range(1, t)]
        pending = [group.expect_chunk(x_r.shape, x_r.dtype, (r - k) % t, GATHER_TAG) for k in range(1, t)]
        pieces[r] = x_r
        products = {r: [times(x_r, w) for w in weights]}  # the chunk already here, while the others move
        for k in range(1, t):
            j = (r - k) % t
            pieces[j] = group.take_chunk(pending[k - 1], "all_gather", k, t - 1, gemms)
            products[j] = [times(pieces[j], w) for w in weights]
        group.finish_chunks(sends)
        gathered = np.concatenate(pieces, axis=SEQ_AXIS) if keep_gathered else None
    else:
        gathered = group.all_gather(x_r, axis=SEQ_AXIS)
        products = {j: [times(chunk(gathered, j, c), w) for w in weights] for j in range(t)}
    outs = [np.concatenate([products[j][i] for j in range(t)], axis=SEQ_AXIS) for i in range(len(weights))]
    return (outs, gathered) if keep_gathered else outs


def _partial(inputs: Sequence[np.ndarray], weights: Sequence[np.ndarray], j: int, c: int) -> np.ndarray:
    """Σ_i chunk j of ``inputs[i]`` · ``weights[i]``, added in the order given (a multi-output layer's dx)."""
    out = None
    for x, w in zip(inputs, weights):
        y = times(chunk(x, j, c), w)
        out = y if out is None else np.add(out, y, out=out)
    return out


def matmul_scatter(inputs: Sequence[np.ndarray], weights: Sequence[np.ndarray], group: Group, *,
                   overlap: bool) -> np.ndarray:
    """``reduce_scatter(Σ_i inputs[i]·weights[i])`` along the sequence: ``inputs[i] [b, s, k_i]``,
    ``weights[i] [k_i, n]`` -> this rank's ``[b, s/t, n]``, chunk by chunk, summed in rank order."""
    t, r, s = group.size, group.rank, inputs[0].shape[SEQ_AXIS]
    check_sequence_length(s, t)  # a ConfigError, not the collective's ValueError
    c = s // t
    gemms = tuple((inputs[0].shape[0] * s, w.shape[1], w.shape[0]) for w in weights)
    if not (overlap and t > 1):
        partials = np.stack([_partial(inputs, weights, j, c) for j in range(t)])
        return group.reduce_scatter_in_rank_order(partials, (inputs[0].shape[0], s, partials.shape[-1]))
    sends, kept, pending = [], [], []
    for k in range(1, t):  # the chunk for rank r+k, sent while the next one is computed
        p = _partial(inputs, weights, (r + k) % t, c)
        if k == 1:  # the receives, posted once the chunks' dtype is known (16-bit operands: 16-bit products)
            pending = [group.expect_chunk(p.shape, p.dtype, (r - i) % t, SCATTER_TAG) for i in range(1, t)]
        kept.append(p)  # a posted send's buffer lives until finish_chunks
        sends.append(group.post_chunk(p, (r + k) % t, SCATTER_TAG))
    mine = _partial(inputs, weights, r, c)  # while the last chunk moves
    parts: list = [None] * t
    parts[r] = mine
    for k in range(1, t):
        parts[(r - k) % t] = group.take_chunk(pending[k - 1], "reduce_scatter", k, t - 1, gemms)
    group.finish_chunks(sends)
    return sum_in_rank_order(parts)
