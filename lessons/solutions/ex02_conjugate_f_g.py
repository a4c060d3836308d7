"""Reference answer to exercise 02 — the backward of f and g (lesson 02_conjugate_f_g.py)."""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group


def f_forward(x: np.ndarray, group: Group) -> np.ndarray:
    return x


def g_forward(y_partial: np.ndarray, group: Group) -> np.ndarray:
    return group.all_reduce(y_partial)


def f_backward(dy: np.ndarray, group: Group) -> np.ndarray:
    """x fed every rank's branch: its gradient is the sum of the branches' partial gradients."""
    return group.all_reduce(dy)


def g_backward(dy: np.ndarray, group: Group) -> np.ndarray:
    """∂(Σ_r y_r)/∂y_r is the identity: every term receives the upstream gradient unchanged, no communication."""
    return dy
