"""Reference answer to exercise 04 — the parallel MLP's forward wiring (lesson 04_parallel_mlp.py)."""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.nn import gelu_forward, linear_forward


def parallel_mlp_forward(x: np.ndarray, fc_weight: np.ndarray, fc_bias: np.ndarray, proj_weight: np.ndarray,
                         proj_bias: np.ndarray, group: Group) -> np.ndarray:
    h, _ = linear_forward(x, fc_weight, fc_bias)  # [tokens, ffn/p]: column-parallel, no communication (f = identity)
    a, _ = gelu_forward(h)  # element-wise, so the shard alone is enough
    partial, _ = linear_forward(a, proj_weight, None)  # [tokens, h]: this rank's term of the row-parallel sum
    return group.all_reduce(partial) + proj_bias  # g: the one all-reduce, then the replicated bias once
