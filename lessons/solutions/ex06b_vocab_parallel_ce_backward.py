"""Reference answer to exercise 06b — the vocab-parallel cross-entropy's backward (lesson 06)."""

from __future__ import annotations

import numpy as np


def vocab_parallel_nll_backward(logits_local: np.ndarray, targets: np.ndarray, vocab_start: int,
                                log_z: np.ndarray) -> np.ndarray:
    grad = np.exp(logits_local - log_z[:, None])  # this rank's columns of the global softmax: log Z is global
    local = targets - vocab_start
    mine = (local >= 0) & (local < logits_local.shape[1])  # the tokens whose target column lives here
    grad[np.flatnonzero(mine), local[mine]] -= 1.0  # − onehot, only on the owner
    return grad / len(targets)  # the mean over the N tokens
