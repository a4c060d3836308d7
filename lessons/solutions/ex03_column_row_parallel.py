"""Reference answer to exercise 03 — RowParallelLinear's forward given its shard (lesson 03)."""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.nn import linear_forward


def row_parallel_forward(y_shard: np.ndarray, weight_shard: np.ndarray, bias: np.ndarray,
                         group: Group) -> np.ndarray:
    partial, _ = linear_forward(y_shard, weight_shard, None)  # [tokens, out]: this rank's term of Σ_i Y_i·B_i
    return group.all_reduce(partial) + bias  # g, then the bias once (on every rank's partial it counts p times)
