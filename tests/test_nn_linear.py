"""Linear: the backward of y = x·W + b against finite differences, grad accumulation, master-weight copies."""

import numpy as np
import pytest

from tpsim.nn import Linear, check_module_grads, linear_backward, linear_forward

TOL = 1e-7  # float64 central differences with eps 1e-6 land near 1e-9; 1e-7 leaves honest headroom


@pytest.mark.parametrize("lead", [(13,), (2, 3, 5)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_grads_match_finite_differences(lead, bias):
    rng = np.random.default_rng(1)
    layer = Linear(17, 11, bias=bias, rng=rng, std=0.5,
                   bias_value=rng.standard_normal(11) if bias else None)
    x = rng.standard_normal((*lead, 17))
    errors = check_module_grads(layer, x)
    assert set(errors) == ({"input", "weight", "bias"} if bias else {"input", "weight"})
    for name, err in errors.items():
        assert err < TOL, f"{name}: max relative error {err:.3e} vs finite differences"


def test_linear_forward_matches_reference_and_keeps_shape():
    rng = np.random.default_rng(2)
    w, b = rng.standard_normal((17, 11)), rng.standard_normal(11)
    x = rng.standard_normal((2, 3, 5, 17))
    y, cache = linear_forward(x, w, b)
    ref = np.einsum("abci,io->abco", x, w) + b
    assert y.shape == (2, 3, 5, 11)
    assert cache.x is x and cache.w is w and cache.has_bias, "the cache references the inputs, never copies"
    assert np.allclose(y, ref, rtol=0, atol=1e-12), f"max diff {np.abs(y - ref).max():.3e}"


def test_linear_backward_without_bias_returns_none_for_db():
    rng = np.random.default_rng(3)
    x, w, dy = rng.standard_normal((13, 17)), rng.standard_normal((17, 11)), rng.standard_normal((13, 11))
    _, cache = linear_forward(x, w, None)
    dx, dw, db = linear_backward(dy, cache)
    assert db is None
    assert dx.shape == x.shape and dw.shape == w.shape
    assert np.allclose(dw, x.T @ dy, rtol=0, atol=1e-12), f"max diff {np.abs(dw - x.T @ dy).max():.3e}"


def test_linear_accumulates_grads_across_two_backward_calls():
    rng = np.random.default_rng(4)
    layer = Linear(17, 11, rng=rng)
    x, dy = rng.standard_normal((13, 17)), rng.standard_normal((13, 11))
    _, cache = layer.forward(x)
    layer.backward(dy, cache)
    once = {k: g.copy() for k, g in layer.grads.items()}
    layer.backward(dy, cache)
    for name, g in layer.grads.items():
        diff = np.abs(g - 2 * once[name]).max()
        assert diff < 1e-12, f"{name}: second backward must add (+=), max diff from 2x is {diff:.3e}"
    layer.zero_grad()
    assert all(not g.any() for g in layer.grads.values()), "zero_grad left nonzero gradients"


def test_linear_copies_given_master_weights_and_checks_shapes():
    rng = np.random.default_rng(5)
    master_w, master_b = rng.standard_normal((17, 11)), rng.standard_normal(11)
    layer = Linear(17, 11, weight=master_w, bias_value=master_b)
    assert np.array_equal(layer.params["weight"], master_w) and np.array_equal(layer.params["bias"], master_b)
    layer.params["weight"][0, 0] += 1.0
    assert layer.params["weight"][0, 0] != master_w[0, 0], "Linear must copy the master weight, not alias it"
    with pytest.raises(ValueError, match="shape"):
        Linear(17, 11, weight=master_w.T)
    with pytest.raises(ValueError, match="bias"):
        Linear(17, 11, bias=False, bias_value=master_b)


def test_linear_default_init_is_seeded_normal_and_zero_bias():
    a, b = Linear(17, 11), Linear(17, 11)
    assert np.array_equal(a.params["weight"], b.params["weight"]), "default rng must be seeded (reproducible)"
    assert not a.params["bias"].any(), "bias must start at zero"
    std = a.params["weight"].std()
    assert 0.015 < std < 0.025, f"weight std {std:.4f} is far from 0.02"
    assert Linear(17, 11, dtype=np.float32).params["weight"].dtype == np.float32
