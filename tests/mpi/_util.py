"""Comparison helpers shared by the multi-rank tests (the difference itself is ``tpsim.compare``'s)."""

from __future__ import annotations

import numpy as np

from tpsim.compare import relative_difference


def assert_close(actual, expected, tol: float = 1e-12, what: str = "") -> None:
    """max |actual − expected| ≤ tol · max(1, max |expected|), i.e. ``relative_difference`` ≤ tol; names the tensor."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    d = relative_difference(actual, expected, floor=1.0)
    assert d <= tol, f"{what}: max |diff| / max(1, max |expected|) = {d:.3e} > {tol:.0e}"


def randn(seed: int, *shape, dtype=np.float64) -> np.ndarray:
    """The same random array on every rank for the same seed."""
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)
