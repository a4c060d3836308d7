"""One TP × DP training step, shared by the demo and the tests: the loss of the *global* batch, done right.

The model's loss is the mean over *this rank's* non-ignored tokens. Averaging the replicas' gradients (DDP)
then gives the mean of per-replica means — which is the global-batch mean only when every replica has the same
number of valid tokens. With padding (``ignore_index``) they differ, so each replica scales its backward (under
context parallelism "replica" means each of the dp·cp ranks holding the same model shard, ``grid.replicas``:
each CP rank's loss is the mean over its own tokens, and the same rule makes their sum the global mean):

    n_d = valid tokens of replica d,   N = Σ_d n_d   (one tiny all-reduce in the DP group)
    global loss  L = Σ_d n_d·L_d / N
    dL/dθ = Σ_d (n_d/N)·∇L_d = (1/dp)·Σ_d (dp·n_d/N)·∇L_d     → backward with dloss = dp·n_d/N, then DDP's mean

The same all-reduce carries ``n_d·L_d`` too, so the reported loss is the global mean, identical on every rank
(TP ranks computed the same ``L_d``; each DP group reduces the same numbers). It is issued after the forward
(the losses are needed) and before the backward (dloss is needed), traced as scope "loss_normalizer", phase
"dp_sync"; with dp == 1 it is skipped and dloss = 1.

    zero_grad → forward → [all-reduce n, n·L] → backward(dloss) → grad_sync.sync() → clip? → optimizer.step()

With a ``StepGuard`` the norm is measured every step and a non-finite loss or norm skips the update on every
rank together (``tpsim.train.nonfinite``).

``tracer.step`` is left to the caller (set it before the call to tag this step's collectives).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.nn.dropout import DropoutPlan
from tpsim.nn.module import Module
from tpsim.phases import DP_SYNC
from tpsim.train.ddp import GradSync
from tpsim.train.nonfinite import StepGuard
from tpsim.train.protocol import OptimizerProtocol


@dataclass(frozen=True)
class StepResult:
    loss: float  # mean loss over the global batch's valid tokens (all DP replicas), the same on every rank
    grad_norm: float | None  # global gradient norm before clipping; None when neither clip nor guard was given
    tokens: int  # valid (non-ignored) tokens in the global batch
    skipped: bool = False  # the guard skipped the update (non-finite loss or norm): params and optimizer unchanged
    reason: str | None = None  # why it was skipped


def global_loss_scale(grid: ProcessGrid, loss_local: float, n_local: int) -> tuple[float, float, int]:
    """``(global mean loss, dloss for this replica's backward, global valid tokens)``; see the module docstring.

    One all-reduce of ``float64 [2] = (n_d, n_d·L_d)`` in the DP group when dp > 1 (counts are exact in float64
    far beyond any batch). A replica without valid tokens gets dloss 0; a global batch without any, loss 0.
    """
    if grid.replicas == 1:  # the DP x CP ranks (``replicas``: dp, or dp·cp under context parallelism)
        return float(loss_local), 1.0, int(n_local)
    with grid.tracer.region(scope="loss_normalizer", phase=DP_SYNC):
        total = grid.dp_group.all_reduce(np.array([n_local, n_local * loss_local], dtype=np.float64))
    n_global = int(total[0])
    if n_global == 0:
        return 0.0, 0.0, 0
    return float(total[1] / n_global), n_local * grid.replicas / n_global, n_global


def compute_grads(model: Module, grid: ProcessGrid, grad_sync: GradSync | None, ids_local: np.ndarray,
                  labels_local: np.ndarray, *, plan: DropoutPlan = DropoutPlan(),
                  loss_scale: float = 1.0) -> tuple[float, int]:
    """The first half of a step: gradients of the global-batch mean loss, DP-synced; ``(loss, valid tokens)``.

    ``loss_scale``: float16's dynamic loss scale S (``optimizer.loss_scale``): the backward starts from S·dloss
    and the gradients stay scaled until the optimizer's ``unscale_grads`` (``apply_update``) divides them.

    Split from ``train_step`` so a caller can look at (check, export) the gradients before the update.
    """
    if grad_sync is None and grid.replicas > 1:
        raise ValueError(f"dp x cp = {grid.replicas}: gradients must be averaged over the DP group by a GradSync")
    if grad_sync is not None:  # (--overlap-param-gather: each layer waits for its all-gathers at its forward)
        grad_sync.start_step()
    model.zero_grad()
    loss_local, cache = model.forward(ids_local, labels_local, plan)
    n_local = int(np.count_nonzero(np.asarray(labels_local) != model.loss.ignore_index))
    loss, dloss, n_global = global_loss_scale(grid, loss_local, n_local)
    if grad_sync is not None:  # --overlap-grad-reduce: the one backward is the last micro-batch's
        grad_sync.arm()
    model.backward(dloss * loss_scale if loss_scale != 1.0 else dloss, cache)
    if grad_sync is not None:
        grad_sync.disarm()
        grad_sync.sync()
    return loss, n_global


def apply_update(model: Module, optimizer: OptimizerProtocol, grid: ProcessGrid, clip: float | None = None, *,
                 guard: StepGuard | None = None, loss: float | None = None, found_inf: bool = False) -> float | None:
    """The second half, straight through the optimizer protocol (``tpsim.train.protocol``): unscale, measure,
    clip, step; returns the global gradient norm before clipping (or None when nothing measured it).

    ``model`` is the model ``optimizer`` steps (the protocol reaches its gradients itself). float16's loss scaler
    unscales first; an overflow found on any rank skips the step — no clipping, no update. Without a ``guard`` the
    norm is measured only to clip (``clip`` None: neither). With a ``guard`` (``tpsim.train.nonfinite``) it is
    measured every step, clipping or not, and ``guard.decide(loss, norm, found_inf=...)`` may skip clipping and
    the update on every rank together; its verdict is ``guard.last``. ``found_inf`` (or the scaler's overflow) is
    "skip, don't count" — until the scale sits at its minimum, where an overflow is a real non-finite step and
    counts (``Overflow.counts``).
    """
    overflow = optimizer.unscale_grads()
    if guard is None and overflow.found:
        return None
    with guard.quiet() if guard is not None else nullcontext():
        norm = optimizer.grad_norm(grid) if guard is not None or clip is not None else None
        uncounted = found_inf or (overflow.found and not overflow.counts)  # skip, but not a divergence
        verdict = guard.decide(loss, norm, found_inf=uncounted) if guard is not None else None
        if overflow.found or (verdict is not None and verdict.skipped):
            return norm
        if clip is not None:
            optimizer.clip_grads(clip, norm)
        optimizer.step()
    return norm


def train_step(model: Module, optimizer: OptimizerProtocol, grid: ProcessGrid, grad_sync: GradSync | None,
               ids_local: np.ndarray, labels_local: np.ndarray, *, plan: DropoutPlan = DropoutPlan(),
               clip: float | None = None, guard: StepGuard | None = None) -> StepResult:
    """One optimizer step on this DP replica's rows ``ids_local, labels_local: int [b/dp, s]``.

    ``model``: a GPT (serial or TP) with ``forward(ids, labels, plan) -> (loss, cache)`` and
    ``backward(dloss, cache)``; its ``loss.ignore_index`` marks padding. ``grad_sync``: the ``GradSync`` of
    ``model`` over ``grid.dp_group`` (``None`` is allowed only when dp == 1). ``plan``: the dropout plan; under
    DP its ``batch_index`` should be this replica's global rows (``dp_slice``), so masks equal serial training's.
    ``clip``: max gradient norm (``clip_grad_norm`` over the TP group, after the DP sync); ``math.inf`` measures
    the norm without clipping. ``guard``: a ``StepGuard`` that skips a non-finite step on every rank together
    (and raises ``TrainingStopped`` after too many in a row); the step runs under ``guard.quiet()``.
    """
    if guard is None:
        loss, n_global = compute_grads(model, grid, grad_sync, ids_local, labels_local, plan=plan)
        return StepResult(loss=loss, grad_norm=apply_update(model, optimizer, grid, clip), tokens=n_global)
    with guard.quiet():
        loss, n_global = compute_grads(model, grid, grad_sync, ids_local, labels_local, plan=plan)
    norm = apply_update(model, optimizer, grid, clip, guard=guard, loss=loss)
    verdict = guard.last
    guard.record(verdict)
    return StepResult(loss=loss, grad_norm=norm, tokens=n_global, skipped=verdict.skipped, reason=verdict.reason)
