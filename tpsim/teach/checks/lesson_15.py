"""The check of exercise 15 (mixed precision): bfloat16 rounding on the bits against ml_dtypes' cast, and the
loss scaler's rule against ``tpsim.train.loss_scale.DynamicLossScaler``.

The inputs hold the cases that separate the right rounding from the usual wrong ones: exact ties (normal and
subnormal), subnormals, and finite float32 values beyond bfloat16's largest finite number, which round to ±inf.
The scaler's cases sit on both sides of the growth step (one clean step before it, at it) and on the floor."""

from __future__ import annotations

import numpy as np

from tpsim.nn.precision import bfloat16
from tpsim.teach.checks.registry import exercise
from tpsim.teach.verdict import Report
from tpsim.train.loss_scale import DynamicLossScaler

TRUNCATED = "you truncated (rounded toward zero): the dropped 16 bits were thrown away"
HALF_UP = "halfway cases rounded up (away from zero), not to the even neighbour"
SATURATED = ("values beyond bfloat16's largest finite number stopped there (±3.39e38): rounding to nearest takes "
             "them to ±inf, as a cast does")
FLUSHED = "subnormal inputs came out as ±0: bfloat16 has subnormals too, and their bits round like any others"
LATE = ("the scale grew one clean step late: it must grow on the growth_interval-th clean step in a row, not "
        "on the step after")
EARLY = "the scale grew one clean step early: growth_interval clean steps in a row come first"
NO_RESTART = "the count of clean steps was not restarted"
NO_FLOOR = "the scale backed off below min_scale: an overflow never takes it under the floor"
NO_SKIP = "an overflow did not skip the step: the gradients hold inf or NaN, so this step must not update"
SKIPPED_CLEAN = "a clean step was skipped: only an overflow skips"

F32_MAX = np.finfo(np.float32).max


def _inputs() -> np.ndarray:
    ulp = np.float32(2.0 ** -7)
    ties = np.array([1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + ulp / 2), 3 + 2 * ulp], np.float32)  # exact halfway
    # subnormals: two exact ties (odd kept part: up; even: down), the smallest one, a few others
    tiny = np.array([0x00018000, 0x00028000, 0x00000001, 0x0000FFFF, 0x807F7FFF, 0x00408000], np.uint32)
    # beyond bfloat16's largest finite 0x7F7F: ±FLT_MAX, the exact tie above it (→ inf), one just below it
    huge = np.array([0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF], np.uint32)
    rng = np.random.default_rng(15)
    spread = rng.standard_normal(40) * 10.0 ** rng.integers(-8, 8, 40)
    return np.concatenate([ties, tiny.view(np.float32), huge.view(np.float32), spread]).astype(np.float32)


def bfloat16_symptoms(x: np.ndarray, want: np.ndarray) -> dict:
    """``{sentence: the uint16 bits that slip gives}`` for ``x`` (``want``: the right bits)."""
    bits = x.view(np.uint32).astype(np.int64)
    sign = (bits >> 16) & 0x8000
    saturated = np.where((want & 0x7FFF) == 0x7F80, sign | 0x7F7F, want)
    flushed = np.where((bits & 0x7F800000) == 0, sign, want)
    return {TRUNCATED: bits >> 16, HALF_UP: (bits + 0x8000) >> 16, SATURATED: saturated, FLUSHED: flushed}


def scaler_rule(scale: float, good: int, found_inf: bool, interval: int, *, grows_after: int = 0,
                restart: bool = True, floor: bool = True, skip: bool = True, skip_clean: bool = False):
    """The scaler's step with one slip switched on: growth ``grows_after`` steps off, no restart of the count,
    no floor on the back-off, no skip on overflow, a skip on a clean step. All off: the right rule."""
    if found_inf:
        return max(scale * 0.5, 1.0) if floor else scale * 0.5, 0 if restart else good, skip
    good += 1
    if good == interval + grows_after:
        return scale * 2.0, 0 if restart else good, skip_clean
    return scale, good, skip_clean


SCALER_SLIPS = {LATE: {"grows_after": 1}, EARLY: {"grows_after": -1}, NO_RESTART: {"restart": False},
                NO_FLOOR: {"floor": False}, NO_SKIP: {"skip": False}, SKIPPED_CLEAN: {"skip_clean": True}}
# (found_inf, scale, good_steps, growth_interval): clean steps before, just before and at the growth step;
# overflows above the floor, at it and just above it (1.5 × 0.5 < 1)
SCALER_CASES = [(False, 2.0 ** 16, 0, 3), (False, 2.0 ** 16, 1, 3), (False, 2.0 ** 16, 2, 3),
                (True, 2.0 ** 16, 2, 3), (True, 1.0, 0, 5), (True, 1.5, 4, 5), (False, 8.0, 998, 1000),
                (False, 8.0, 999, 1000), (False, 4.0, 0, 1)]


@exercise("15", "bfloat16_bits", "update_loss_scale",
          bfloat16_bits=("bfloat16 is the top 16 bits of a float32: x.view(np.uint32) >> 16 truncates; what must "
                         "you add first to round to nearest instead?",
                         "adding 0x8000 rounds halfway cases up; ties-to-even adds 0x7FFF plus the last bit you keep",
                         "uint32 is enough for finite inputs (0xFF7FFFFF + 0x8000 < 2^32): "
                         "((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) as uint16"),
          update_loss_scale=("two cases: an overflow (skip, back off, restart the count) or a clean step (count it)",
                             "the count restarts at 0 both after an overflow and after the scale grows",
                             "clean: good += 1; if good == growth_interval: scale *= growth, good = 0"))
def check_15(r: Report) -> None:
    x = _inputs()
    want = x.astype(bfloat16).view(np.uint16).astype(np.int64)
    got = r.call("bfloat16_bits", x.copy())
    r.compare(f"bfloat16_bits({x.size} float32 values: 4 exactly halfway, 6 subnormal, 3 that round to ±inf)",
              got, want, tol=0, symptoms=bfloat16_symptoms(x, want), layout="values")
    for found_inf, scale, good, interval in SCALER_CASES:
        ref = DynamicLossScaler(scale=scale, growth_interval=interval, good_steps=good)
        ref.update(found_inf)
        got = r.call("update_loss_scale", scale, good, found_inf, interval)
        r.compare(f"update_loss_scale(scale {scale:g}, good_steps {good}, found_inf {found_inf}, interval {interval})",
                  got, np.array([ref.scale, ref.good_steps, found_inf], np.float64), tol=0,
                  symptoms={sentence: np.array(scaler_rule(scale, good, found_inf, interval, **slip), np.float64)
                            for sentence, slip in SCALER_SLIPS.items()})
