"""Check a hand-written backward against central finite differences, the way llm.c checks its layers.

    ∂f/∂x_i ≈ (f(x + ε·e_i) − f(x − ε·e_i)) / 2ε          (error O(ε²), so ε = 1e-6 gives ~1e-10 in float64)

A module's output is a tensor, so the check first makes a scalar out of it with a fixed random upstream
gradient: ``L = Σ out · dout``. Then ``∂L/∂x`` is exactly what ``backward(dout, cache)`` returns and
``∂L/∂W`` is what it adds into ``grads``, and every one of them can be compared with the finite difference.

The reported error per tensor is ``max |analytic − numeric| / max(|analytic|, |numeric|)``: relative to the
tensor's scale rather than elementwise, since elementwise ratios blow up on entries that are nearly zero. It is
``tpsim.compare.relative_difference``, measured against the larger of the two scales (neither side is the
reference: the finite difference has its own O(ε²) error).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from tpsim.compare import relative_difference
from tpsim.nn.module import Module


def numerical_grad(f: Callable[[], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central-difference gradient of the scalar ``f()`` w.r.t. ``x``, perturbing ``x`` in place (restored)."""
    grad = np.zeros(x.shape, dtype=np.float64)
    for idx in np.ndindex(x.shape):
        orig = x[idx]
        x[idx] = orig + eps
        f_plus = float(f())
        x[idx] = orig - eps
        f_minus = float(f())
        x[idx] = orig  # restore exactly, not orig + eps - eps
        grad[idx] = (f_plus - f_minus) / (2.0 * eps)
    return grad


def relative_error(analytic: np.ndarray, numeric: np.ndarray) -> float:
    """``max |a − n|`` over the larger of the two tensors' max magnitudes; 0 when both are all zero."""
    return relative_difference(analytic, numeric, floor=float(np.max(np.abs(analytic), initial=0.0)))


def check_module_grads(
    module: Module, *inputs, dout_seed: int = 0, eps: float = 1e-6, forward_kwargs: dict | None = None
) -> dict[str, float]:
    """Relative error of the analytic gradients of ``module`` against finite differences, per tensor.

    Keys: ``"input"`` for ``inputs[0]`` (skipped when it is an integer array, e.g. token ids) and the dotted
    name of every parameter. ``forward_kwargs`` are passed to every forward call; they must make it
    deterministic (a dropout layer needs a fixed ``keep`` mask). Zeroes the module's grads, then fills them.
    """
    kwargs = forward_kwargs or {}
    out, cache = module.forward(*inputs, **kwargs)
    dout = np.random.default_rng(dout_seed).standard_normal(np.shape(out))

    module.zero_grad()
    dx = module.backward(dout, cache)
    analytic = {name: g.copy() for name, g in module.named_grads()}

    def scalar() -> float:
        return float(np.sum(module.forward(*inputs, **kwargs)[0] * dout))

    errors: dict[str, float] = {}
    x = inputs[0]
    if isinstance(x, np.ndarray) and x.dtype.kind == "f" and dx is not None:
        errors["input"] = relative_error(dx, numerical_grad(scalar, x, eps))
    for name, param in module.named_parameters():
        errors[name] = relative_error(analytic[name], numerical_grad(scalar, param, eps))
    return errors
