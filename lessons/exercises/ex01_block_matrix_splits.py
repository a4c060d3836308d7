"""Exercise 01 — assemble a product from its blocks (lesson 01_block_matrix_splits.py).

Plain NumPy, one process. Check it with:   tpsim check 01
The reference answer: tpsim lesson solution 01 (prints where it is) — try first.
"""

from __future__ import annotations

import numpy as np


def column_parallel_matmul(x: np.ndarray, a_blocks: list[np.ndarray]) -> np.ndarray:
    """The SenseParrots article's eq. (1): ``x · [A_1 … A_p] = [x·A_1 … x·A_p]``.

    ``x: [tokens, inner]``; ``a_blocks``: the column blocks of ``A: [inner, out]``, block i ``[inner, out_i]``
    (widths may differ). Return ``x · A: [tokens, out]`` built from the p products ``x · A_i`` — what p
    devices, one block each, would compute with no communication — laid side by side.
    """
    # TODO: multiply x by every block and put the p results next to each other.
    raise NotImplementedError


def row_parallel_matmul(y_blocks: list[np.ndarray], b_blocks: list[np.ndarray]) -> np.ndarray:
    """The SenseParrots article's eq. (2): ``[Y_1 … Y_p] · [B_1; …; B_p] = Y_1·B_1 + … + Y_p·B_p``.

    ``y_blocks``: the column blocks of ``Y: [tokens, inner]``, block i ``[tokens, inner_i]``; ``b_blocks``: the
    matching row blocks of ``B: [inner, out]``, block i ``[inner_i, out]``. Return ``Y · B: [tokens, out]``.
    """
    # TODO: every pair (Y_i, B_i) gives a partial product of the full shape; combine them.
    raise NotImplementedError
