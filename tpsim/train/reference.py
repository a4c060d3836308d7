"""An independent reference for the optimizer protocol's step, written from the published definitions and
sharing no code with ``tpsim.train``'s optimizers (a reference that called them would share their bugs).

The order is Megatron-LM's ``MixedPrecisionOptimizer.step`` and PyTorch's recipe for clipping with a
``GradScaler`` (``scaler.unscale_(opt)``, then ``clip_grad_norm_``, then ``scaler.step(opt)``):

    1. unscale     g ← g · (1/S) for every float32 main gradient            (``GradScaler.unscale_``)
    2. agree       found_inf = any gradient on any rank is inf/NaN           (one flag for every rank)
                   found_inf: skip the update; S ← S·backoff (at least the minimum), the clean-step count restarts
                   otherwise: after ``growth_interval`` clean steps in a row, S ← S·growth
    3. clip        ‖g‖₂ of the *unscaled* gradients; g ← g·max_norm/(‖g‖₂ + 1e-6) where that is below 1
    4. step        AdamW (Loshchilov & Hutter 2019, ``torch.optim.AdamW``) on the float32 main parameters
    5. round       the 16-bit parameters ← the main parameters, nearest-even

Clipping before step 1 would measure S·‖g‖ and scale by a coefficient S times too small: AdamW, nearly
invariant to the gradients' scale, hides most of it, which is why the tests compare the norm too. Serial and
whole-tensor on purpose: the caller hands it full gradients (every rank's whole model, or gathered shards).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

EPS_CLIP = 1e-6  # torch.nn.utils.clip_grad_norm_: max_norm / (total_norm + 1e-6)


def reference_clip(grads: Sequence[np.ndarray], max_norm: float) -> float:
    """PyTorch's ``clip_grad_norm_``: ‖g‖₂ over every gradient; scale all by max_norm / (‖g‖ + 1e-6) if below 1."""
    norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads))
    coef = max_norm / (norm + EPS_CLIP)
    if coef < 1.0:
        for g in grads:
            g *= coef
    return norm


def reference_adamw(p, g, m, v, t: int, lr: float, betas, eps: float, weight_decay: float) -> None:
    """One AdamW step in place, as published (decoupled decay: it acts on the weight, never through m and v)."""
    beta1, beta2 = betas
    p *= 1.0 - lr * weight_decay
    m[...] = beta1 * m + (1.0 - beta1) * g
    v[...] = beta2 * v + (1.0 - beta2) * g * g
    m_hat, v_hat = m / (1.0 - beta1 ** t), v / (1.0 - beta2 ** t)
    p -= lr * m_hat / (np.sqrt(v_hat) + eps)


@dataclass
class ReferenceMixedPrecision:
    """Steps 1–5 above on whole float32 copies: ``main`` (the main parameters, made from ``params16``, the
    16-bit starting weights), AdamW's ``m`` and ``v``, the scale S and its clean-step count; ``rounded()`` is
    step 5. ``decays[i]``: parameter i's weight decay."""

    params16: Sequence[np.ndarray]
    scale: float
    lr: float
    betas: tuple[float, float]
    eps: float
    decays: Sequence[float]
    growth_interval: int = 1000
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    min_scale: float = 1.0
    t: int = 0  # AdamW's step count: skipped steps do not count
    clean: int = 0  # clean steps since the scale last changed
    main: list[np.ndarray] = field(init=False)
    m: list[np.ndarray] = field(init=False)
    v: list[np.ndarray] = field(init=False)

    def __post_init__(self) -> None:
        self.main = [np.array(p, dtype=np.float32) for p in self.params16]
        self.m = [np.zeros_like(p) for p in self.main]
        self.v = [np.zeros_like(p) for p in self.main]

    def step(self, scaled_grads: Sequence[np.ndarray], max_norm: float) -> float | None:
        """One step from the loss-scaled float32 gradients of the whole model (left untouched); the norm of the
        unscaled gradients, or None when the step was skipped for an inf/NaN."""
        grads = [np.array(g, dtype=np.float32) * np.float32(1.0 / self.scale) for g in scaled_grads]
        if not all(np.isfinite(g).all() for g in grads):
            self.scale, self.clean = max(self.scale * self.backoff_factor, self.min_scale), 0
            return None
        self.clean += 1
        if self.clean == self.growth_interval:
            self.scale, self.clean = self.scale * self.growth_factor, 0
        norm = reference_clip(grads, max_norm)
        self.t += 1
        for p, g, m, v, wd in zip(self.main, grads, self.m, self.v, self.decays):
            reference_adamw(p, g, m, v, self.t, self.lr, self.betas, self.eps, wd)
        return norm

    def rounded(self) -> list[np.ndarray]:
        """Step 5: the 16-bit parameters the model would now hold (nearest-even from the main parameters)."""
        return [p.astype(p16.dtype) for p, p16 in zip(self.main, self.params16)]
