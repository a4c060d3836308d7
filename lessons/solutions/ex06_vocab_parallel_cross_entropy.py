"""Reference answer to exercise 06 — the parallel softmax's three reductions (lesson 06)."""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group


def vocab_parallel_nll(logits_local: np.ndarray, targets: np.ndarray, vocab_start: int,
                       group: Group) -> np.ndarray:
    m = group.all_reduce(logits_local.max(axis=1), op="max")  # (3) global max per token: exp never overflows
    s = group.all_reduce(np.exp(logits_local - m[:, None]).sum(axis=1))  # (3) Σ_c exp(z_c − m), all columns
    local = targets - vocab_start
    mine = (local >= 0) & (local < logits_local.shape[1])  # tokens whose target column lives on this rank
    picked = np.zeros(len(targets), dtype=logits_local.dtype)
    picked[mine] = logits_local[np.flatnonzero(mine), local[mine]]
    z_target = group.all_reduce(picked)  # (4) the owner sends the target logit, every other rank 0
    return m + np.log(s) - z_target  # log Z − z_t, with log Z = m + log Σ exp(z − m)
