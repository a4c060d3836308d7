"""Non-finite training, Megatron's way: measure the gradient norm every step, skip a broken update on every
rank together, stop after too many broken steps in a row.

Megatron-LM (Shoeybi et al. 2019, arXiv:1909.08053) computes the TP-aware global gradient norm on every step
(one all-reduce of one float64: ``tpsim.train.clip.grad_norm``) whether or not it clips, and logs it; with
mixed precision (Micikevicius et al. 2017, arXiv:1710.03740) a step whose gradients hold an inf or a NaN is
skipped — the parameters and the optimizer state stay as they were — and the loss scale is lowered.

``StepGuard`` is that decision. ``apply_update(..., guard=g, loss=L)`` asks ``g.decide(L, norm)`` before the
optimizer step; the decision needs no collective of its own and is identical on every rank, because both inputs
already are: the loss is the global batch's (``global_loss_scale``) and the norm is reduced over the TP group
from DP-synced gradients. A NaN anywhere makes both NaN everywhere.

    verdict = guard.decide(loss, norm)            # StepVerdict(skipped, reason, counted)
    if not verdict.skipped: optimizer.step()
    guard.record(verdict)                         # after max_skipped counted skips in a row: TrainingStopped

**Hook for a loss scaler** (fp16): a scaler that found an inf in its unscaled gradients passes
``found_inf=True``; the step is skipped with reason "loss scaler found inf/nan gradients" and ``counted=False``:
it does not count toward ``max_skipped`` (skipping is the scaler's normal way of finding its scale) and does not
reset the run of counted skips either. A non-finite loss still counts: no scale explains a NaN loss.

``first_nonfinite`` names the parameter whose gradient went non-finite first in backward order (the last
parameter in forward order that holds an inf/NaN); it is a local scan, run only on a skipped step, and the
answer is agreed across ranks (one tiny all-reduce of an index) so every rank prints the same name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tpsim.errors import TrainingStopped

FOUND_INF = "loss scaler found inf/nan gradients"
ADVICE = "lower the learning rate or clip the gradients, or allow more skipped steps in a row (max_skipped)"


@dataclass(frozen=True)
class StepVerdict:
    skipped: bool = False
    reason: str | None = None  # why the update was skipped: "loss is nan", "gradient norm is inf", ...
    counted: bool = True  # counts toward StepGuard.max_skipped (a loss scaler's overflow does not)


def _not_finite(what: str, value: float | None) -> str | None:
    if value is None or math.isfinite(value):
        return None
    return f"{what} is {'nan' if math.isnan(value) else 'inf' if value > 0 else '-inf'}"


class StepGuard:
    """Skip the update of a step whose loss or gradient norm is not finite; stop after ``max_skipped`` in a row."""

    def __init__(self, max_skipped: int = 3, *, advice: str = ADVICE) -> None:
        if max_skipped < 0:
            raise ValueError(f"max_skipped must be >= 0, got {max_skipped}")
        self.max_skipped = max_skipped
        self.advice = advice  # the end of the stop message: what to change (a program names its own flags)
        self.consecutive = 0  # counted skips in a row, up to the last step
        self.skipped_total = 0
        self.last = StepVerdict()

    def quiet(self):
        """``np.errstate`` for a guarded step: overflow and NaN are expected there and reported by the guard
        (one line naming the step), not as NumPy RuntimeWarnings. Only around the step, never globally."""
        return np.errstate(over="ignore", invalid="ignore", divide="ignore")

    def decide(self, loss: float | None, norm: float | None, *, found_inf: bool = False) -> StepVerdict:
        """The verdict for one step; identical on every rank when ``loss`` and ``norm`` are (module docstring)."""
        bad_loss, bad_norm = _not_finite("loss", loss), _not_finite("gradient norm", norm)
        if bad_loss:  # no loss scale explains a non-finite loss
            self.last = StepVerdict(True, " and ".join(r for r in (bad_loss, bad_norm) if r))
        elif found_inf:  # the scaler's overflow (its norm is inf too): skip, but it does not count
            self.last = StepVerdict(True, FOUND_INF, counted=False)
        elif bad_norm:
            self.last = StepVerdict(True, bad_norm)
        else:
            self.last = StepVerdict()
        return self.last

    def record(self, verdict: StepVerdict, *, step: int | None = None, detail: str = "") -> None:
        """Count ``verdict``; raise ``TrainingStopped`` after ``max_skipped`` counted skips in a row."""
        if not verdict.skipped:
            self.consecutive = 0
            return
        self.skipped_total += 1
        if not verdict.counted:
            return
        self.consecutive += 1
        if self.consecutive >= self.max_skipped:
            at = "" if step is None else f" (last at step {step})"
            raise TrainingStopped(f"stopped: {self.consecutive} consecutive steps skipped{at}: {verdict.reason}"
                                  f"{detail}; {self.advice}")


def first_nonfinite(named_grads, agree=None) -> str | None:
    """The parameter whose gradient first went non-finite in backward order, the same name on every rank.

    ``named_grads``: ``[(name, grad)]`` in forward order, the same names on every rank (shards differ);
    ``agree``: a ``tpsim.comm.agree.Agreement`` over the ranks to agree on (None: this rank alone).
    """
    names = [name for name, _ in named_grads]
    bad = [i for i, (_, g) in enumerate(named_grads) if not np.isfinite(g).all()]
    mine = max(bad) if bad else -1  # backward runs the forward order in reverse: the highest index came first
    index = int(mine if agree is None else agree.reduce([mine], op="max")[0])
    return names[index] if index >= 0 else None


def report_skip(guard: StepGuard, model, step: int, loss: float, norm: float | None, say, agree=None) -> None:
    """After a guarded update: on a skipped step, one line via ``say`` (step, loss, norm, reason, the first
    non-finite gradient), then ``guard.record`` (which raises ``TrainingStopped`` after too many in a row).

    Every rank must call it (the name is agreed over ``agree``, default the untraced world, on skipped steps)."""
    verdict, detail = guard.last, ""
    if verdict.skipped and verdict.counted:
        if agree is None:
            from tpsim.comm.agree import Agreement  # here: the guard itself stays MPI-free

            agree = Agreement()
        with guard.quiet():
            layer = first_nonfinite([(e.name, e.grad) for e in model.named_entries()], agree)
        detail = (f"; first non-finite gradient in backward order: {layer}" if layer else
                  "; every gradient is finite: the sum of their squares overflowed" if norm is not None
                  and math.isinf(norm) and loss is not None and math.isfinite(loss) else "")
    if verdict.skipped:
        say(f"  step {step:4d}  SKIPPED ({verdict.reason}): loss {loss:.4g}  |grad| {norm:.4g}{detail}; "
            f"parameters and optimizer state unchanged "
            f"({guard.consecutive + verdict.counted} of {guard.max_skipped} in a row)")
    guard.record(verdict, step=step, detail=detail)
