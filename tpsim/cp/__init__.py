"""Context parallelism: the sequence cut over C ranks for attention too (issue 26, in progress).

    layout   which positions a CP rank holds (contiguous, or the load-balanced zigzag) and its causal work
    blocks   attention one K/V block at a time: partial output and log-sum-exp, the online-softmax merge, and
             each block's share of dQ, dK, dV — the arithmetic a ring of CP ranks runs, MPI-free
"""
