"""Vocab-parallel softmax cross-entropy — the SenseParrots article, eqs. (3)(4): the loss without gathering the logits.

Rank r holds the logits z_r: [tokens, Vp/p] of its vocabulary slice (from ``ParallelLMHead``). The loss of a
row needs only three numbers per token, each a reduction over the vocabulary, so each is one all-reduce of
[tokens] elements — never the [tokens, V] logits:

    (3)  m   = max_c z_c                      all_reduce MAX of the local maxima
         S   = Σ_c exp(z_c − m)               all_reduce SUM of the local sums         log Z = m + log S
    (4)  z_t = the target's logit             all_reduce SUM: the owner sends it, every other rank 0
         loss_i = log Z_i − z_{t_i}

Label smoothing ε (PyTorch's definition, as ``tpsim.nn.cross_entropy``) must hold *globally*:

         loss_i = (1 − ε)(log Z_i − z_{t_i}) + ε (log Z_i − (1/V) Σ_{c<V} z_c)

The mean runs over the whole real vocabulary, so Σ_c z_c is summed over ranks too; it travels with z_t in one
all-reduce of shape [2, tokens] (row 0: target logit, row 1: Σ_c z_c), keeping it three collectives.
Megatron-LM averages log p over the *local* shard only, so each rank gets a different, wrong loss at tp > 1.

Padded columns (global index ≥ V) never enter the max, the sum or the mean, and get an exactly zero
gradient. The backward needs no communication — every rank already has m and S:

    dz_r = (softmax_r − (1 − ε) · onehot_r − ε/V on real columns) · dloss / n_valid

Rows whose target is ``ignore_index`` are left out of the mean and get a zero gradient; if all rows are
ignored the loss is 0, not 0/0. All exponents are ≤ 0 after subtracting m, so logits ×1000 are safe.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.comm import Group
from tpsim.kinds import SOFTMAX_NORM, marked
from tpsim.nn.module import Module
from tpsim.nn.precision import fp32_inside
from tpsim.phases import FORWARD


class VocabParallelCrossEntropyCache(NamedTuple):
    softmax: np.ndarray  # [N, n_real] this rank's softmax over its real columns (the forward's exp, reused)
    target_rows: np.ndarray  # [k] rows whose (valid) target lives on this rank
    target_cols: np.ndarray  # [k] the target's local column in those rows
    valid: np.ndarray  # [N] bool, False where the target is ignore_index
    n_valid: int
    label_smoothing: float
    vocab_size: int  # V, the real vocabulary (the ε/V term)
    shape: tuple[int, ...]  # logits_local's shape [..., Vp/p]


@marked(SOFTMAX_NORM)  # its three all-reduces are subtracted: they are collectives
@fp32_inside  # 16-bit in: float32 inside, the activation rounded back
def vocab_parallel_cross_entropy_forward(
        logits_local: np.ndarray, targets: np.ndarray, group: Group, *, vocab_size: int, vocab_start: int,
        ignore_index: int = -100, label_smoothing: float = 0.0) -> tuple[float, VocabParallelCrossEntropyCache]:
    """``logits_local: [..., Vp/p]`` (columns [vocab_start, vocab_start + Vp/p)), ``targets: [...]`` replicated.

    Returns ``(mean loss over non-ignored targets, identical on every rank, cache)``. The three all-reduces
    are tagged phase "forward"; the caller's tracer region supplies the scope.
    """
    # validated on every rank before the first collective: targets are replicated, so all ranks raise alike
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    targets = np.asarray(targets)
    if targets.shape != logits_local.shape[:-1]:
        raise ValueError(f"targets shape {targets.shape} must equal logits shape without V {logits_local.shape[:-1]}")
    t = targets.reshape(-1)
    valid = t != ignore_index
    if np.any((t[valid] < 0) | (t[valid] >= vocab_size)):
        raise IndexError(f"targets must be in [0, {vocab_size}) or equal ignore_index={ignore_index}")
    per_rank = logits_local.shape[-1]
    n_real = min(max(vocab_size - vocab_start, 0), per_rank)  # this rank's columns that are real tokens
    z = logits_local.reshape(t.size, per_rank)[:, :n_real]  # a view: padded columns are cut off here, once
    n_tokens = z.shape[0]

    # the target's owner: its local column is in range; a non-owner (and every ignored row) sends 0
    local_t = t - vocab_start
    rows = np.flatnonzero(valid & (local_t >= 0) & (local_t < n_real))
    cols = local_t[rows]

    with group.tracer.region(phase=FORWARD):
        # (3a) global max; a rank without real columns offers -inf, the identity of MAX
        local_max = z.max(axis=1) if n_real else np.full(n_tokens, -np.inf, dtype=z.dtype)
        m = group.all_reduce(local_max, op="max")  # [N]
        e = z - m[:, None]  # shifted logits, ≤ 0; one [N, n_real] array reused for exp and softmax
        # packed [2, N] with smoothing: row 0 the target's shifted logit, row 1 Σ_c of shifted logits
        picked = np.zeros((2 if label_smoothing else 1, n_tokens), dtype=z.dtype)
        picked[0, rows] = e[rows, cols]
        if label_smoothing:
            picked[1] = e.sum(axis=1)
        np.exp(e, out=e)
        # (3b) global Σ exp
        s = group.all_reduce(e.sum(axis=1), op="sum")  # [N]
        # (4) target logit (and Σ_c z_c): [N], or [2, N] with smoothing
        picked = group.all_reduce(picked if label_smoothing else picked[0], op="sum").reshape(picked.shape)

    log_s = np.log(s)  # log Z − m: every logit below is shifted by m, so m cancels
    nll = log_s - picked[0]
    if label_smoothing:
        nll = (1.0 - label_smoothing) * nll + label_smoothing * (log_s - picked[1] / vocab_size)
    n_valid = int(valid.sum())
    loss = float(nll[valid].sum() / n_valid) if n_valid else 0.0
    e /= s[:, None]  # now the softmax over this rank's real columns
    cache = VocabParallelCrossEntropyCache(e, rows, cols, valid, n_valid, float(label_smoothing), vocab_size,
                                           logits_local.shape)
    return loss, cache


@marked(SOFTMAX_NORM)
def vocab_parallel_cross_entropy_backward(dloss, cache: VocabParallelCrossEntropyCache) -> np.ndarray:
    """``dloss`` (scalar) -> ``dlogits_local`` in ``logits_local``'s shape ``[..., Vp/p]``; no communication."""
    softmax, rows, cols, valid, n_valid, eps, vocab_size, shape = cache
    n_real = softmax.shape[1]
    dz = np.zeros((softmax.shape[0], shape[-1]), dtype=softmax.dtype)  # padded columns stay exactly 0
    real = dz[:, :n_real]
    real[...] = softmax  # a copy: the cache stays usable for a second backward
    real[rows, cols] -= 1.0 - eps
    if eps:
        real -= eps / vocab_size
    # each valid row carries weight 1 / n_valid in the mean; ignored rows carry none
    dz *= np.where(valid, float(dloss) / max(n_valid, 1), 0.0)[:, None]
    return dz.reshape(shape)


class VocabParallelCrossEntropy(Module):
    """Mean cross-entropy of vocab-parallel logits; ``forward(logits_local [..., Vp/p], targets [...])``.

    Collectives are traced under scope ``self.path``, phase "forward"; the backward issues none.
    """

    def __init__(self, group: Group, *, vocab_size: int, vocab_start: int, ignore_index: int = -100,
                 label_smoothing: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
        self.group, self.vocab_size, self.vocab_start = group, vocab_size, vocab_start
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing

    def forward(self, logits_local: np.ndarray, targets: np.ndarray) -> tuple[float, VocabParallelCrossEntropyCache]:
        with self.group.tracer.region(scope=self.path):
            return vocab_parallel_cross_entropy_forward(
                logits_local, targets, self.group, vocab_size=self.vocab_size, vocab_start=self.vocab_start,
                ignore_index=self.ignore_index, label_smoothing=self.label_smoothing)

    def backward(self, dout, cache: VocabParallelCrossEntropyCache) -> np.ndarray:
        """``dout`` is d(objective)/d(loss), 1.0 when the loss is the objective -> ``dlogits_local``."""
        return vocab_parallel_cross_entropy_backward(dout, cache)

    def __repr__(self) -> str:
        return (f"VocabParallelCrossEntropy(vocab_size={self.vocab_size}, vocab_start={self.vocab_start}, "
                f"ignore_index={self.ignore_index}, label_smoothing={self.label_smoothing})")
