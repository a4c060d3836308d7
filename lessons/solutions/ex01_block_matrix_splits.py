"""Reference answer to exercise 01 — assemble a product from its blocks (lesson 01_block_matrix_splits.py)."""

from __future__ import annotations

import numpy as np


def column_parallel_matmul(x: np.ndarray, a_blocks: list[np.ndarray]) -> np.ndarray:
    """The SenseParrots article's eq. (1): ``x · [A_1 … A_p] = [x·A_1 … x·A_p]``;
    ``x: [tokens, inner]`` -> ``[tokens, out]``."""
    return np.concatenate([x @ a for a in a_blocks], axis=-1)  # each block alone, side by side


def row_parallel_matmul(y_blocks: list[np.ndarray], b_blocks: list[np.ndarray]) -> np.ndarray:
    """The SenseParrots article's eq. (2): ``Σ_i Y_i · B_i``; every term already has the full output shape
    ``[tokens, out]``."""
    return sum(y @ b for y, b in zip(y_blocks, b_blocks))
