"""Reference answer to exercise 07 — the TP-aware gradient norm (lesson 07_dropout_rng_and_clipping.py)."""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.nn.module import Partition


def tp_grad_norm(entries: list[tuple[str, np.ndarray, Partition | None]], group: Group) -> float:
    # a shard is counted by its owner; a replicated gradient (the same everywhere) by TP rank 0 alone
    local = sum(float(np.sum(np.square(g, dtype=np.float64))) for _, g, part in entries
                if part is not None or group.rank == 0)
    return float(np.sqrt(group.all_reduce(np.array([local]))[0]))
