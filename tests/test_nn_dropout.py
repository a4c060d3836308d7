"""Inverted dropout: identity when off, the given mask used exactly, the right keep rate, the same mask back."""

import numpy as np
import pytest

from tpsim.nn import Dropout, check_module_grads, dropout_mask_apply

TOL = 1e-7


def test_dropout_p0_and_eval_are_identity():
    x = np.random.default_rng(0).standard_normal((13, 17))
    y, cache = Dropout(0.0).forward(x)
    assert y is x and cache.keep is None
    y, cache = Dropout(0.5).forward(x, training=False)
    assert y is x and cache.keep is None
    dy = np.ones_like(x)
    assert Dropout(0.5).backward(dy, cache) is dy, "identity forward must have identity backward"


def test_dropout_uses_the_given_mask_exactly():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 5))
    keep = rng.random(x.shape) >= 0.3
    y, cache = Dropout(0.3).forward(x, keep=keep)
    expected = np.where(keep, x / 0.7, 0.0)
    assert np.abs(y - expected).max() < 1e-15, f"max diff {np.abs(y - expected).max():.3e}"
    assert np.array_equal(cache.keep, keep)


def test_dropout_keep_rate_and_mean_with_fixed_seed():
    p, n = 0.3, 200_000
    x = np.ones(n)
    y, cache = Dropout(p).forward(x, rng=np.random.default_rng(2))
    keep = cache.keep
    sigma = np.sqrt(p * (1 - p) / n)  # binomial standard deviation of the keep rate
    rate = keep.mean()
    assert abs(rate - (1 - p)) < 5 * sigma, f"keep rate {rate:.5f}, expected {1 - p} +- {5 * sigma:.5f}"
    # inverted dropout keeps the expectation: E[y] = x
    assert abs(y.mean() - 1.0) < 5 * sigma / (1 - p), f"mean of y {y.mean():.5f} drifted from 1"


def test_dropout_is_reproducible_from_a_seed():
    x = np.ones((13, 17))
    k1 = Dropout(0.5).forward(x, rng=np.random.default_rng(7))[1].keep
    k2 = Dropout(0.5).forward(x, rng=np.random.default_rng(7))[1].keep
    k3 = Dropout(0.5, rng=np.random.default_rng(8)).forward(x)[1].keep
    assert np.array_equal(k1, k2)
    assert not np.array_equal(k1, k3)


def test_dropout_backward_applies_the_same_mask():
    rng = np.random.default_rng(3)
    x, dy = rng.standard_normal((13, 17)), rng.standard_normal((13, 17))
    layer = Dropout(0.4)
    y, cache = layer.forward(x, rng=rng)
    keep = cache.keep
    dx = layer.backward(dy, cache)
    assert np.array_equal(dx == 0, ~keep | (dy == 0)), "gradient must vanish exactly where the mask dropped"
    assert np.abs(dx - dropout_mask_apply(dy, keep, 0.4)).max() == 0.0


def test_dropout_grad_matches_finite_differences_with_fixed_mask():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 5, 17))
    keep = rng.random(x.shape) >= 0.25
    errors = check_module_grads(Dropout(0.25), x, forward_kwargs={"keep": keep})
    assert errors["input"] < TOL, f"dropout dx max relative error {errors['input']:.3e}"


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_dropout_rejects_p_outside_unit_interval(p):
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        Dropout(p)


def test_dropout_rejects_bad_masks():
    x = np.ones((3, 4))
    with pytest.raises(ValueError, match="shape"):
        Dropout(0.5).forward(x, keep=np.ones((4, 3), dtype=bool))
    with pytest.raises(TypeError, match="boolean"):
        Dropout(0.5).forward(x, keep=np.ones((3, 4)))
