"""A reduce-scatter's sum in one fixed order: the contributions added in group-rank order, 0 first, MPI-free.

An MPI library sums a reduce-scatter in whatever order its algorithm visits the ranks (MPICH: recursive halving
for short messages, pairwise exchange for long ones), and floating-point addition is not associative: at
p ≥ 4 a ring that adds the same partial sums in another order gives other bits (at p = 2 there is one addition,
and a + b = b + a exactly). Sequence parallelism's reduce-scatters (ḡ forward, f̄ backward) therefore add the
p partial chunks a rank receives *itself*, left to right in group-rank order,

    ((c_0 + c_1) + c_2) + ... + c_{p−1}

whether the chunks came in one blocking all-to-all (``Group.reduce_scatter_in_rank_order``) or one by one
while the next GEMM ran (``tpsim.tp.collective_matmul``, ``--tp-comm-overlap``): the same additions in the same
order, so the two give the same bits. A 16-bit chunk is added as ``tpsim.comm.half``'s reduction adds one:
both operands cast up to float32, added, rounded back to 16 bits at every step.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tpsim.nn.precision import FP32, HALF_DTYPES


def sum_in_rank_order(chunks: Sequence[np.ndarray]) -> np.ndarray:
    """``chunks[0] + chunks[1] + ... `` left to right (16-bit: in float32, rounded each step): a fresh array."""
    if not chunks:
        raise ValueError("sum_in_rank_order: no chunks")
    half = chunks[0].dtype if chunks[0].dtype in HALF_DTYPES else None
    acc = np.array(chunks[0], copy=True)
    for c in chunks[1:]:
        if half is None:
            acc += c
        else:
            acc = (acc.astype(FP32) + c.astype(FP32)).astype(half)
    return acc
