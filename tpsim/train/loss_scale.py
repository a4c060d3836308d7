"""Dynamic loss scaling for float16 training (Micikevicius et al. 2017, arXiv:1710.03740, §3.2; Megatron-LM's
``DynamicGradScaler``): the float16 gradients of small losses underflow, so the loss is multiplied by a scale S
before the backward and the float32 main gradients divided by S before the update.

    initial S = 2^16
    every step:   found_inf = any main gradient is inf/NaN on ANY rank (one traced all-reduce MAX over the
                  world group: TP and DP together)
    found_inf:    skip the optimizer step (the weights and the optimizer state stay as they were),
                  S ← max(S · backoff, min_scale), the growth counter restarts
    otherwise:    after ``growth_interval`` clean steps in a row, S ← S · growth

bfloat16 has float32's exponent range and needs no scaling (Megatron uses none for --bf16).

This skip is the *scaler's* skip: an overflow that a smaller scale will cure. It is not a divergence. Only when
the scale sits at ``min_scale`` and still overflows is the step a real non-finite step — ``at_minimum`` says
so, for the reliability work's non-finite-step counter (tpsim/train/nonfinite.py) to count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpsim.phases import OPTIMIZER


@dataclass
class DynamicLossScaler:
    scale: float = 2.0 ** 16
    growth_interval: int = 1000
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    min_scale: float = 1.0
    good_steps: int = 0  # clean steps since the last change of the scale
    skipped_steps: int = 0  # steps skipped for an overflow, in total

    def __post_init__(self) -> None:
        if not (self.scale > 0 and self.min_scale > 0 and self.growth_factor >= 1 and 0 < self.backoff_factor < 1):
            raise ValueError("need scale > 0, min_scale > 0, growth_factor >= 1 and 0 < backoff_factor < 1")
        if self.growth_interval < 1:
            raise ValueError(f"growth_interval must be >= 1, got {self.growth_interval}")

    def update(self, found_inf: bool) -> None:
        """The rule above, after the found-inf flag has been agreed on every rank."""
        if found_inf:
            self.skipped_steps += 1
            self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0

    @property
    def at_minimum(self) -> bool:
        """True when backing off can no longer help: an overflow now is a real non-finite step."""
        return self.scale <= self.min_scale

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, sd: dict) -> None:
        self.scale, self.good_steps = float(sd["scale"]), int(sd["good_steps"])
        self.skipped_steps = int(sd["skipped_steps"])


def found_inf_anywhere(grads, world) -> bool:
    """True on every rank iff some rank holds a non-finite value in ``grads`` (its local shards): one traced
    all-reduce (MAX of a float64 [1]) over ``world`` — the TP and the DP group at once — scope "loss_scaler",
    phase "optimizer"."""
    local = any(not np.isfinite(g).all() for g in grads)
    with world.tracer.region(scope="loss_scaler", phase=OPTIMIZER):
        flag = world.all_reduce(np.array([1.0 if local else 0.0]), op="max")
    return bool(flag[0] > 0)


def unscale_and_agree(grads, scaler: DynamicLossScaler, world) -> bool:
    """Divide the float32 main gradients ``grads`` by the scale in place, agree on overflow over ``world``
    (``found_inf_anywhere``) and update ``scaler``; True when the step must be skipped. Plain mixed precision
    passes whole gradients, ZeRO-1 its owned (reduced) slices: each element is then checked by its one owner."""
    inv = 1.0 / scaler.scale
    for g in grads:
        g *= inv
    found = found_inf_anywhere(grads, world)
    scaler.update(found)
    return found
