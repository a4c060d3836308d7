"""The noise floor of a training run: how far rounding alone carries it, the yardstick of the final-state verdict.

A parallel run adds its partial sums in another order than the serial model (over TP shards, DP replicas,
micro-batches), so its gradients differ from serial's in the last bits (step 0: ~1e-15 in float64). Training
amplifies such differences, by how much depends on the run: Adam divides by √v̂ + eps, so where v̂ is tiny a
last-bit change of a gradient moves a weight by a sizeable part of lr, and a deep model at a large lr is chaotic,
nearby trajectories parting exponentially. Measured in float64 at TP 2 × DP 4, lr 3e-3, the largest relative
difference from serial (of ``exp_avg``) after 30 steps: 2 layers 6e-14, 4 layers 1.1e-7, 6 layers 1.2, all from
~1e-15 at step 1 and growing steadily, no jump; 4 layers at lr 1e-3 stay at 5e-14. A serial run started from
weights one ulp away drifts just as far, so this is no bug of the parallel code — and no fixed tolerance can tell
rounding from a bug at every depth, lr and step count.

So the verdict measures the run's own amplification. A nudged twin is the serial model trained the same steps
from starting weights moved by about one unit in the last place (each element × (1 ± ε), ε the dtype's machine
epsilon, the signs drawn from one of ``SIGNS_SEEDS``); its difference from the exact twin is measured as the
verdict measures the parallel run (the last loss; the parameters, ``exp_avg`` and ``exp_avg_sq``, each relative
to the largest serial value of its kind). The noise floor is the largest of the three patterns' differences,
per kind, and the rule uses the largest kind:

    every difference ≤ step 0's tolerance     MATCH; no floor is measured (it could only widen the tolerance)
    otherwise  tolerance = max(step 0's tolerance, NOISE_FACTOR × floor), and
      MATCH        every difference ≤ tolerance ≤ DECIDABLE
      MISMATCH     some difference > tolerance
      NOT DECIDED  every difference ≤ tolerance, but tolerance > DECIDABLE: rounding alone grows into differences
                   the size of a bug's, so no comparison with a serial run can tell the two apart

Three patterns, because one is a single draw: over eight sign patterns one run's floor spans a factor of 11 to
81, and a parallel run reached 26 times the lowest; the largest of any three of the eight put it within 2 times.
Measured with these three (docs/guide/tracer.md), the parallel run's largest difference is 0.1–1.8 floors over
float64 and float32; 2, 4 and 6 layers; 1 to 100 steps; TP, DP, TP × DP, sequence parallelism, ZeRO-1 and
pipelines; lr 1e-3 to 3e-2, clipping on and off. ``NOISE_FACTOR`` 10 leaves five times the largest ratio seen.
``DECIDABLE`` 1e-2: the planted bugs of tests/test_demo_verdicts.py differ from serial by 2.1e-2 to 2.5e-1 in
their most visible kind after three steps, so a tolerance above 1e-2 could pass them.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


NOISE_FACTOR = 10.0  # the parallel run may differ from serial by this many noise floors
DECIDABLE = 1e-2  # above this tolerance the comparison could pass a real bug: the verdict is "not decided"
SIGNS_SEEDS = (0, 1, 2)  # the nudge's sign patterns, fixed (the verdict stays deterministic): the floor is their largest
KINDS = ("loss", "param", "exp_avg", "exp_avg_sq")  # what the final verdict compares, in this order


def floor_ranks(world_size: int) -> list[int]:
    """The rank that trains each sign pattern's twin: the last ranks, one pattern each, so they train at once
    (rank 0 last, as it may still be writing files); fewer ranks than patterns train several in turn."""
    return [(world_size - 1 - j) % world_size for j in range(len(SIGNS_SEEDS))]


def nudge(params: Sequence[np.ndarray], seed: int) -> None:
    """Move every starting weight by about one unit in the last place, in place: × (1 ± ε), the signs drawn
    from ``seed`` (one of ``SIGNS_SEEDS``)."""
    signs = np.random.default_rng(seed)
    for p in params:
        p *= 1 + np.finfo(p.dtype).eps * signs.choice(np.array([-1.0, 1.0], p.dtype), p.shape)


def state_differences(got: Sequence, expected: Sequence) -> list[float]:
    """``[loss, param, exp_avg, exp_avg_sq]`` differences of two whole serial states ``[loss, *params, *m, *v]``:
    the loss relative to ``expected``'s, each kind's largest |Δ| relative to its largest ``expected`` value."""
    n = (len(expected) - 1) // 3
    out = [abs(float(got[0]) - float(expected[0])) / (abs(float(expected[0])) or 1.0)]
    for k in range(3):
        pairs = list(zip(got[1 + k * n:1 + (k + 1) * n], expected[1 + k * n:1 + (k + 1) * n]))
        scale = max(float(np.max(np.abs(e), initial=0.0)) for _, e in pairs) or 1e-30
        out.append(max(float(np.max(np.abs(g - e), initial=0.0)) for g, e in pairs) / scale)
    return out


def tolerance(floor: Sequence[float] | None, step0_tolerance: float) -> float:
    """``max(step 0's tolerance, NOISE_FACTOR × the largest floor of any kind)`` (module docstring), step 0's
    where no floor was measured; infinite where the nudged twin is not finite (it diverged: nothing is decided)."""
    if floor is None:
        return step0_tolerance
    largest = float(np.max(floor))
    return math.inf if math.isnan(largest) else max(step0_tolerance, NOISE_FACTOR * largest)


def judge(worst: Sequence[float], tol: float) -> bool | None:
    """True (MATCH), False (MISMATCH) or None (NOT DECIDED) by the module docstring's rule."""
    if not np.all(np.asarray(worst) <= tol):  # a NaN difference is a mismatch
        return False
    return True if tol <= DECIDABLE else None
