"""Exercise 15 — round to bfloat16 by hand, and the loss scaler's rule (lesson 15_mixed_precision.py).

Plain NumPy on every rank. Check it with:   tpsim check 15
The reference answer: tpsim lesson solution 15 (prints where it is) — try first.
"""

from __future__ import annotations

import numpy as np


def bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """The bfloat16 nearest to each float32 in ``x``, as its 16 bits (``uint16``, same shape).

    bfloat16 is the top half of a float32: sign, the same 8 exponent bits, 7 fraction bits. Rounding keeps the
    top 16 bits of the float32's 32 and rounds the dropped 16 to nearest, ties to even (the kept last bit
    even). ``x`` holds finite float32 values; one beyond bfloat16's largest finite number rounds to ±inf, as a
    cast does.
    """
    # TODO: view x as uint32; add what makes the top half round to nearest-even; keep the top 16 bits.
    raise NotImplementedError


def update_loss_scale(scale: float, good_steps: int, found_inf: bool, growth_interval: int,
                      growth: float = 2.0, backoff: float = 0.5, min_scale: float = 1.0) -> tuple[float, int, bool]:
    """One step of dynamic loss scaling: ``(new scale, new good_steps, skip this step?)``.

    An overflow anywhere (``found_inf``): skip the step, scale × backoff (not below ``min_scale``), the count of
    clean steps starts again at 0. A clean step: count it; after ``growth_interval`` clean steps in a row the
    scale grows × growth and the count starts again at 0.
    """
    # TODO: two cases, overflow or not.
    raise NotImplementedError
