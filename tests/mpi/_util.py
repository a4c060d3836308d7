"""Comparison helpers shared by the multi-rank tests."""

from __future__ import annotations

import numpy as np


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, f"shape {a.shape} != {b.shape}"
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def assert_close(actual, expected, tol: float = 1e-12, what: str = "") -> None:
    """|actual - expected| <= tol · max(1, max|expected|), elementwise max; the message names the tensor."""
    d = max_diff(actual, expected)
    scale = max(1.0, float(np.max(np.abs(expected))) if np.size(expected) else 1.0)
    assert d <= tol * scale, f"{what}: max |diff| = {d:.3e} > {tol:.0e} x {scale:.3g}"


def randn(seed: int, *shape, dtype=np.float64) -> np.ndarray:
    """The same random array on every rank for the same seed."""
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)
