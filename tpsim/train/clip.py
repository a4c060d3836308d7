"""Gradient clipping under tensor parallelism: the global norm from the shards, with one all-reduce.

clip_grad_norm is the SenseParrots article's example (§2.2.3) of a place that needs the whole model's
parameters and therefore a collective of its own.

The serial model's gradient norm is ‖g‖_p = (Σ_params Σ_elements |g|^p)^(1/p). Under TP a parameter is either

  * **sharded** (it has a ``Partition``): each TP rank holds a disjoint slice, so every rank adds the |g|^p of
    its own slice and the sum over the TP group covers each element exactly once; or
  * **replicated** (no Partition: LayerNorm weights, the row-parallel bias): every TP rank holds the *same*
    full gradient. If every rank added it, the sum over the group would count it tp times and the "norm" would
    be inflated — clipping would then fire at a different threshold than in serial training and TP would no
    longer equal serial. So, as in Megatron, only ``tp_rank == 0`` counts replicated parameters.

Each rank reduces its contribution to one number and a single all-reduce over the TP group combines them —
SUM of Σ|g|^p for finite p, MAX of max|g| for p = ∞ — traced as ``scope="clip_grad_norm", phase="optimizer"``.
Every rank then takes the same root, so the returned norm is identical across the TP group.

Data parallelism needs nothing here: gradients are assumed already averaged over the DP group (the DP sync
runs before clipping), so every DP replica holds the same gradients and computes the same norm by itself.

Pipeline parallelism spreads the layers over stages, so the sum runs over the *model-parallel* group (TP × PP of
one replica, ``ProcessGrid.model_parallel_group``; Megatron's ``get_model_parallel_group``) and replicated
gradients are counted by ``tp_rank == 0`` of every stage (``count_replicated``). A tied embedding held by the
first and the last stage is counted on the first only: the last stage's copy is marked copy 1
(``Partition.replica``), as Megatron skips shared parameters there.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from tpsim.comm import Group
from tpsim.nn.module import Module, Partition
from tpsim.phases import OPTIMIZER

GradEntry = tuple[str, np.ndarray, Partition | None]  # (dotted name, local grad, Partition or None=replicated)

CLIP_EPS = 1e-6  # PyTorch's clip_grad_norm_: coef = max_norm / (total + 1e-6), which also avoids 0/0


def grad_entries(module: Module) -> list[GradEntry]:
    """(name, local grad, Partition or None) for every parameter of ``module``, each tied array once."""
    return [(e.name, e.grad, e.partition) for e in module.named_entries()]


def _entries(module: Module | None, params: Iterable[GradEntry] | None) -> list[GradEntry]:
    if params is not None:
        return list(params)
    if module is None:
        raise ValueError("pass a module or params=[(name, grad, partition), ...]")
    return grad_entries(module)


def check_norm_type(norm_type: float) -> float:
    """``norm_type`` as a float p, checked: p > 0 (``math.inf`` for the max-norm)."""
    p = float(norm_type)
    if not (p > 0):  # also rejects NaN; p <= 0 is not a norm
        raise ValueError(f"norm_type must be > 0 or inf, got {norm_type}")
    return p


def local_contribution(entries: Iterable[GradEntry], p: float, count_replicated: bool) -> float:
    """This rank's share: Σ|g|^p (or max|g| for p = ∞) over its shards, plus replicated grads if asked.

    ``entries``: (name, grad, Partition or None) — whole shards (``grad_norm``) or ZeRO-1's owned slices of them
    (``DistributedOptimizer.grad_norm``); ``count_replicated``: true on the one rank that counts replicated
    gradients for its group (tp_rank 0)."""
    out = 0.0
    for _, g, part in entries:
        if part is None and not count_replicated:
            continue  # another rank (tp_rank 0) counts this replicated gradient for the whole group
        if part is not None and part.replica:
            continue  # a copy of a shard another rank also holds (a replicated KV head): copy 0 counts it
        if g.size == 0:
            continue
        a = np.abs(g.astype(np.float64, copy=False))  # accumulate in float64 even for float32 grads
        if math.isinf(p):
            out = float(np.maximum(out, a.max()))  # np.maximum keeps a NaN; max() would drop it
        elif p == 2.0:
            out += float(np.vdot(a, a))
        else:
            out += float(np.sum(a ** p))
    return out


def grad_norm(module: Module | None, tp_group: Group, norm_type: float = 2.0, *,
              params: Iterable[GradEntry] | None = None, count_replicated: bool | None = None) -> float:
    """The serial model's gradient norm, computed from this rank's shards with one all-reduce over ``tp_group``.

    ``params`` (optional) replaces ``grad_entries(module)`` with an explicit list of (name, grad, Partition or
    None), e.g. the grads of several modules at once. Returns a Python float, the same on every TP rank.
    ``tp_group`` may be the model-parallel group of a pipeline (TP × PP); then ``count_replicated`` says whether
    this rank counts the replicated gradients (its tp_rank is 0); by default the group's rank 0 does.
    """
    p = check_norm_type(norm_type)
    entries = _entries(module, params)
    if count_replicated is None:
        count_replicated = tp_group.rank == 0
    local = local_contribution(entries, p, count_replicated=count_replicated)
    op = "max" if math.isinf(p) else "sum"
    with tp_group.tracer.region(scope="clip_grad_norm", phase=OPTIMIZER):
        total = float(tp_group.all_reduce(np.array([local], dtype=np.float64), op=op)[0])
    return total if math.isinf(p) else total ** (1.0 / p)


def clip_grad_norm(module: Module | None, tp_group: Group, max_norm: float, norm_type: float = 2.0, *,
                   params: Iterable[GradEntry] | None = None, norm: float | None = None) -> float:
    """Scale every local gradient in place so the global norm is at most ``max_norm``; return the norm *before*.

    coef = max_norm / (norm + 1e-6) is applied only when it is below 1 (PyTorch's rule). Replicated grads are
    scaled on every rank by the same coefficient, so the replicas stay identical. ``norm``: the ``grad_norm``
    already measured this step (Megatron measures it every step, clipping or not), so no second all-reduce.
    """
    _check_max_norm(max_norm)
    entries = _entries(module, params)
    total = grad_norm(None, tp_group, norm_type, params=entries) if norm is None else float(norm)
    scale_grads([g for _, g, _ in entries], max_norm, total)
    return total


def _check_max_norm(max_norm: float) -> None:
    if not max_norm >= 0:
        raise ValueError(f"max_norm must be >= 0, got {max_norm}")


def scale_grads(grads: Iterable[np.ndarray], max_norm: float, norm: float) -> None:
    """PyTorch's rule, given the norm: coef = max_norm / (norm + 1e-6), applied in place only when below 1 —
    never for a NaN norm: a broken step is left for the caller to see, not hidden. Every rank scales its
    arrays (shards, replicated copies, owned slices) by the same coefficient, so replicas stay identical."""
    _check_max_norm(max_norm)
    coef = max_norm / (float(norm) + CLIP_EPS)
    if coef < 1.0:
        for g in grads:
            g *= coef
