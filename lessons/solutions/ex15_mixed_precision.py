"""Reference answer to exercise 15 — bfloat16 rounding on the bits, and the loss scaler's rule (lesson
15_mixed_precision.py)."""

from __future__ import annotations

import numpy as np


def bfloat16_bits(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    keep_odd = (bits >> 16) & 1  # a tie rounds up only when the kept part is odd: ties to even
    # uint32 cannot overflow here: the largest finite float32, 0xFF7FFFFF, + 0x8000 is 0xFF807FFF < 2^32
    return ((bits + 0x7FFF + keep_odd) >> 16).astype(np.uint16)


def update_loss_scale(scale: float, good_steps: int, found_inf: bool, growth_interval: int,
                      growth: float = 2.0, backoff: float = 0.5, min_scale: float = 1.0) -> tuple[float, int, bool]:
    if found_inf:
        return max(scale * backoff, min_scale), 0, True
    good_steps += 1
    if good_steps == growth_interval:
        return scale * growth, 0, False
    return scale, good_steps, False
