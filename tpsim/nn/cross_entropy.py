"""Softmax cross-entropy over a vocabulary, fused with its backward, with ``ignore_index`` and label smoothing.

For a row of logits ``z`` with target ``t`` (PyTorch's definition of label smoothing ``ε``):

    log p_c = z_c − max(z) − log Σ_j exp(z_j − max(z))              (the max-trick: stable for logits ×1000)
    loss    = (1 − ε) · (−log p_t) + ε · mean_c(−log p_c)
    dz      = p − (1 − ε) · onehot(t) − ε / V

The reported loss is the mean over rows whose target is not ``ignore_index`` (padding); ignored rows add
nothing to the loss and get a zero gradient, and if every row is ignored the loss is 0, not 0/0. The fused
gradient ``p − onehot`` is why nobody backpropagates through a separate softmax. Megatron's vocab-parallel
version computes the same three quantities (max, Σ exp, the target logit) with one all-reduce each.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.kinds import SOFTMAX_NORM, marked
from tpsim.nn.module import Module
from tpsim.nn.precision import fp32_inside


class CrossEntropyCache(NamedTuple):
    probs: np.ndarray  # [N, V] softmax of the flattened logits
    targets: np.ndarray  # [N] with ignored rows replaced by 0 (a safe index)
    valid: np.ndarray  # [N] bool, False where the target was ignore_index
    n_valid: int
    label_smoothing: float
    shape: tuple[int, ...]  # the logits' original shape [..., V]


@marked(SOFTMAX_NORM)
@fp32_inside  # 16-bit in: float32 inside, the activation rounded back
def softmax_cross_entropy_forward(
    logits: np.ndarray, targets: np.ndarray, *, ignore_index: int = -100, label_smoothing: float = 0.0
) -> tuple[float, CrossEntropyCache]:
    """``logits: [..., V]``, ``targets: [...]`` ints -> ``(mean loss over non-ignored targets, cache)``."""
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    targets = np.asarray(targets)
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets shape {targets.shape} must equal logits shape without V {logits.shape[:-1]}")
    vocab = logits.shape[-1]
    z = logits.reshape(-1, vocab)
    t = targets.reshape(-1)
    valid = t != ignore_index
    if np.any((t[valid] < 0) | (t[valid] >= vocab)):
        raise IndexError(f"targets must be in [0, {vocab}) or equal ignore_index={ignore_index}")
    t = np.where(valid, t, 0)
    n_valid = int(valid.sum())

    logp = z - z.max(axis=-1, keepdims=True)  # shifted logits, turned into log-probabilities in place
    e = np.exp(logp)
    logp -= np.log(e.sum(axis=-1, keepdims=True))
    nll = -logp[np.arange(len(t)), t]
    if label_smoothing:
        nll = (1.0 - label_smoothing) * nll - label_smoothing * logp.mean(axis=-1)
    loss = float(nll[valid].sum() / n_valid) if n_valid else 0.0
    cache = CrossEntropyCache(np.exp(logp, out=e), t, valid, n_valid, float(label_smoothing), logits.shape)
    return loss, cache


@marked(SOFTMAX_NORM)
def softmax_cross_entropy_backward(dloss, cache: CrossEntropyCache) -> np.ndarray:
    """``dloss`` (scalar) -> ``dlogits`` in the logits' original shape ``[..., V]``."""
    probs, t, valid, n_valid, eps, shape = cache
    dz = probs.copy()  # the cache stays usable: a second backward gives the same answer
    dz[np.arange(len(t)), t] -= 1.0 - eps
    if eps:
        dz -= eps / shape[-1]
    # each valid row carries weight 1 / n_valid in the mean; ignored rows carry none
    scale = np.where(valid, float(dloss) / max(n_valid, 1), 0.0)
    dz *= scale[:, None]
    return dz.reshape(shape)


class CrossEntropyLoss(Module):
    """Mean softmax cross-entropy; ``forward(logits [..., V], targets [...]) -> (loss, cache)``."""

    def __init__(self, *, ignore_index: int = -100, label_smoothing: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, logits: np.ndarray, targets: np.ndarray) -> tuple[float, CrossEntropyCache]:
        return softmax_cross_entropy_forward(
            logits, targets, ignore_index=self.ignore_index, label_smoothing=self.label_smoothing
        )

    def backward(self, dout, cache: CrossEntropyCache) -> np.ndarray:
        """``dout`` is d(objective)/d(loss), 1.0 when the loss is the objective -> ``dlogits [..., V]``."""
        return softmax_cross_entropy_backward(dout, cache)

    def __repr__(self) -> str:
        return f"CrossEntropyLoss(ignore_index={self.ignore_index}, label_smoothing={self.label_smoothing})"
