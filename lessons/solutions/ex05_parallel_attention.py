"""Reference answer to exercise 05 — this rank's qkv columns (lesson 05_parallel_attention.py)."""

from __future__ import annotations

import numpy as np


def qkv_columns(hidden: int, heads: int, tp: int, tp_rank: int) -> np.ndarray:
    width = hidden // tp  # heads/tp heads of hidden/heads columns each
    mine = np.arange(tp_rank * width, (tp_rank + 1) * width)  # my heads' columns inside q
    return np.concatenate([mine, hidden + mine, 2 * hidden + mine])  # ... and the same inside k and v
