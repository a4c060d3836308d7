"""GeLU (tanh and exact) and softmax: derivatives against finite differences, and the numerics that matter."""

import math

import numpy as np
import pytest

from tpsim.nn import GeLU, Softmax, check_module_grads, erf, erfc, gelu_backward, gelu_forward, softmax_backward, softmax_forward

TOL = 1e-7


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("shape", [(13, 17), (2, 3, 5, 17)])
def test_gelu_grad_matches_finite_differences(approximate, shape):
    x = 3.0 * np.random.default_rng(0).standard_normal(shape)  # spread over the curved part and the tails
    errors = check_module_grads(GeLU(approximate), x)
    assert errors["input"] < TOL, f"GeLU({approximate}) dx max relative error {errors['input']:.3e}"


def test_gelu_tanh_and_exact_are_close_but_not_equal():
    x = np.linspace(-6, 6, 2001)
    diff = np.abs(gelu_forward(x, "tanh")[0] - gelu_forward(x, "none")[0])
    assert diff.max() < 1e-3, f"tanh approximation off by {diff.max():.3e}"
    assert diff.max() > 1e-6, f"tanh and exact GeLU should differ, max diff only {diff.max():.3e}"


def test_exact_gelu_matches_math_erfc_reference():
    """Φ(x) = erfc(−x/√2)/2 keeps the left tail accurate: the reference is libm's erfc, not 1 + erf (which cancels)."""
    x = np.concatenate([np.linspace(-10, 10, 1001), [0.0, 1e-300, -1e-8, 37.5, -37.5]])
    ref = np.array([0.5 * v * math.erfc(-v / math.sqrt(2.0)) for v in x])
    got, _ = gelu_forward(x, "none")
    err = np.abs(got - ref) / np.maximum(np.abs(ref), np.finfo(float).tiny)
    assert err.max() <= 2e-15, f"max relative error {err.max():.3e} at x={x[err.argmax()]}"


def _ulps(got, ref):
    return np.abs(got - ref) / np.spacing(np.abs(ref))


# dense in the middle, geometric towards 0 and out to where erfc underflows, both signs
GRID = np.concatenate([np.linspace(-30, 30, 600_001), sign := np.geomspace(1e-300, 27, 50_001), -sign])


def test_vectorised_erf_is_within_3_ulp_of_math_erf():
    ref = np.vectorize(math.erf, otypes=[float])(GRID)
    ulps = _ulps(erf(GRID), ref)
    assert ulps.max() <= 3, f"erf off by {ulps.max():.0f} ulp at x={GRID[ulps.argmax()]!r}"


def test_vectorised_erfc_is_within_8_ulp_of_math_erfc_in_its_own_scale():
    ref = np.vectorize(math.erfc, otypes=[float])(GRID)
    normal = ref > np.finfo(float).tiny  # below that, ulps of subnormals say nothing
    ulps = _ulps(erfc(GRID)[normal], ref[normal])
    assert ulps.max() <= 8, f"erfc off by {ulps.max():.0f} ulp at x={GRID[normal][ulps.argmax()]!r}"


def test_erf_keeps_dtype_and_shape_and_takes_scalars_and_infinities():
    x = np.random.default_rng(1).standard_normal((2, 3, 5)) * 2
    assert erf(x).shape == x.shape and erf(x.astype(np.float32)).dtype == np.float32
    assert np.array_equal(erf(np.array([-np.inf, np.inf, 0.0])), [-1.0, 1.0, 0.0])
    assert np.array_equal(erfc(np.array([-np.inf, np.inf])), [2.0, 0.0])
    assert float(erf(0.5)) == pytest.approx(math.erf(0.5), rel=1e-15)
    assert np.isnan(erf(np.array([np.nan]))).all()


@pytest.mark.parametrize("bad", ["exact", "erf", "", None])
def test_gelu_rejects_unknown_approximation(bad):
    with pytest.raises(ValueError, match="tanh"):
        GeLU(bad)
    with pytest.raises(ValueError, match="none"):
        gelu_forward(np.zeros(3), bad)


@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax_grad_matches_finite_differences(axis):
    x = np.random.default_rng(2).standard_normal((2, 3, 5, 17))
    errors = check_module_grads(Softmax(axis=axis), x)
    assert errors["input"] < TOL, f"softmax dx max relative error {errors['input']:.3e}"


def test_softmax_is_stable_with_huge_logits():
    x = 1000.0 * np.random.default_rng(3).standard_normal((13, 17))
    y, _ = softmax_forward(x)
    assert np.isfinite(y).all(), "softmax of logits x1000 produced NaN/inf"
    sums = y.sum(axis=-1)
    assert np.abs(sums - 1).max() < 1e-12, f"rows sum off by {np.abs(sums - 1).max():.3e}"
    assert np.array_equal(y.argmax(-1), x.argmax(-1))


def test_softmax_matches_naive_and_jacobian_on_moderate_logits():
    rng = np.random.default_rng(4)
    x, dy = rng.standard_normal(17), rng.standard_normal(17)
    y, cache = softmax_forward(x)
    naive = np.exp(x) / np.exp(x).sum()
    assert np.abs(y - naive).max() < 1e-15, f"max diff {np.abs(y - naive).max():.3e}"
    jacobian = np.diag(y) - np.outer(y, y)  # dy_i/dx_j, symmetric
    dx_ref = jacobian @ dy
    dx = softmax_backward(dy, cache)
    assert np.abs(dx - dx_ref).max() < 1e-15, f"max diff {np.abs(dx - dx_ref).max():.3e}"


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_keeps_shape_and_dtype_even_for_a_scalar(approximate):
    # the tanh form works in place on fresh buffers: a 0-d input must still give a 0-d array, float32 stay float32
    for x in (np.array(1.0), np.array([1.0, -2.0], dtype=np.float32)):
        y, cache = gelu_forward(x, approximate)
        dx = gelu_backward(np.ones_like(y), cache)
        assert y.shape == dx.shape == x.shape and y.dtype == dx.dtype == x.dtype
    y, _ = gelu_forward(np.array(1.0), approximate)
    assert float(y) == pytest.approx(0.8411919906082768 if approximate == "tanh" else 0.8413447460685429, rel=1e-15)
