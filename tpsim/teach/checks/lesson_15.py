"""The check of exercise 15 (mixed precision): bfloat16 rounding on the bits against ml_dtypes' cast, and the
loss scaler's rule against ``tpsim.train.loss_scale.DynamicLossScaler``."""

from __future__ import annotations

import numpy as np

from tpsim.nn.precision import bfloat16
from tpsim.teach.checks.registry import exercise
from tpsim.teach.verdict import Report
from tpsim.train.loss_scale import DynamicLossScaler


def _inputs() -> np.ndarray:
    ulp = np.float32(2.0 ** -7)
    ties = np.array([1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + ulp / 2), 3 + 2 * ulp], np.float32)  # exact halfway
    rng = np.random.default_rng(15)
    return np.concatenate([ties, rng.standard_normal(40) * 10.0 ** rng.integers(-8, 8, 40)]).astype(np.float32)


@exercise("15", "bfloat16_bits", "update_loss_scale",
          bfloat16_bits=("bfloat16 is the top 16 bits of a float32: x.view(np.uint32) >> 16 truncates; what must "
                         "you add first to round to nearest instead?",
                         "adding 0x8000 rounds halfway cases up; ties-to-even adds 0x7FFF plus the last bit you keep",
                         "work in uint64 to avoid overflow: ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) as uint16"),
          update_loss_scale=("two cases: an overflow (skip, back off, restart the count) or a clean step (count it)",
                             "the count restarts at 0 both after an overflow and after the scale grows",
                             "clean: good += 1; if good == growth_interval: scale *= growth, good = 0"))
def check_15(r: Report) -> None:
    x = _inputs()
    want = x.astype(bfloat16).view(np.uint16)
    bits = x.view(np.uint32).astype(np.uint64)
    got = r.call("bfloat16_bits", x.copy())
    r.compare("bfloat16_bits(44 float32 values, 4 of them exactly halfway)", np.asarray(got, np.int64),
              want.astype(np.int64), tol=0, layout="values",
              symptoms={"you truncated (rounded toward zero): the dropped 16 bits were thrown away":
                        (bits >> 16).astype(np.int64),
                        "halfway cases rounded up (away from zero), not to the even neighbour":
                        ((bits + 0x8000) >> 16).astype(np.int64)})
    cases = [(False, 2.0 ** 16, 0, 3), (False, 2.0 ** 16, 2, 3), (True, 2.0 ** 16, 2, 3), (True, 1.0, 0, 5),
             (False, 8.0, 998, 1000)]
    for found_inf, scale, good, interval in cases:
        ref = DynamicLossScaler(scale=scale, growth_interval=interval, good_steps=good)
        ref.update(found_inf)
        got = r.call("update_loss_scale", scale, good, found_inf, interval)
        r.compare(f"update_loss_scale(scale {scale:g}, good_steps {good}, found_inf {found_inf}, interval {interval})",
                  np.array(got, dtype=np.float64), np.array([ref.scale, ref.good_steps, found_inf], np.float64), tol=0,
                  symptoms={"the count of clean steps was not restarted": np.array([ref.scale, good + (not found_inf),
                                                                                  found_inf], np.float64)})
