"""LayerNorm: the llm.c backward against finite differences, and what the forward promises."""

import numpy as np
import pytest

from tpsim.nn import LayerNorm, check_module_grads
from tpsim.nn.layernorm import layernorm_backward, layernorm_forward

TOL = 1e-7


@pytest.mark.parametrize("shape", [(13, 17), (2, 3, 5, 17)])
def test_layernorm_grads_match_finite_differences(shape):
    rng = np.random.default_rng(0)
    ln = LayerNorm(17)
    # non-trivial affine params so dw and db are tested through a real scale and shift
    ln.params["weight"][:] = rng.standard_normal(17)
    ln.params["bias"][:] = rng.standard_normal(17)
    x = 2.0 + 3.0 * rng.standard_normal(shape)
    errors = check_module_grads(ln, x)
    assert set(errors) == {"input", "weight", "bias"}
    for name, err in errors.items():
        assert err < TOL, f"{name}: max relative error {err:.3e} vs finite differences"


def test_layernorm_forward_normalises_each_row():
    x = 100.0 + 7.0 * np.random.default_rng(1).standard_normal((2, 3, 5, 17))
    y, _ = LayerNorm(17).forward(x)
    mean_err = np.abs(y.mean(-1)).max()
    v = x.var(-1)
    var_err = np.abs(y.var(-1) - v / (v + 1e-5)).max()  # eps shrinks each row's variance to v / (v + eps)
    assert mean_err < 1e-12, f"row means off zero by {mean_err:.3e}"
    assert var_err < 1e-12, f"row variances off v/(v+eps) by {var_err:.3e}"


def test_layernorm_cache_is_xhat_and_rstd_only():
    x = np.random.default_rng(2).standard_normal((13, 17))
    ln = LayerNorm(17)
    _, cache = ln.forward(x)
    xhat, rstd, w = cache  # exactly two activations, and the weight by reference (not a copy)
    assert w is ln.params["weight"] and cache.PARAMETERS == ("w",)
    ref_rstd = 1 / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    assert xhat.shape == (13, 17) and rstd.shape == (13, 1)
    assert np.abs(rstd - ref_rstd).max() < 1e-12, f"rstd max diff {np.abs(rstd - ref_rstd).max():.3e}"


def test_layernorm_params_and_shape_check():
    ln = LayerNorm(17, eps=1e-6)
    assert np.array_equal(ln.params["weight"], np.ones(17)) and not ln.params["bias"].any()
    assert ln.eps == 1e-6
    with pytest.raises(ValueError, match="17"):
        ln.forward(np.zeros((3, 16)))


def test_layernorm_of_a_strided_input_equals_that_of_its_copy():
    """A column-sliced input (``x[:, idx]``: a CP rank's positions) is not C-contiguous; forward and backward
    must not depend on the layout (the row blocks write into C-ordered buffers)."""
    rng = np.random.default_rng(4)
    x, dy = rng.standard_normal((3, 16, 8)), rng.standard_normal((3, 5, 8))
    idx = np.array([0, 1, 2, 13, 15])
    strided = x[:, idx]  # fancy indexing on axis 1: not C-contiguous
    assert not strided.flags["C_CONTIGUOUS"]
    w, b = rng.standard_normal(8), rng.standard_normal(8)
    y, cache = layernorm_forward(strided, w, b)
    y_ref, cache_ref = layernorm_forward(np.ascontiguousarray(strided), w, b)
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_array_equal(layernorm_backward(np.asfortranarray(dy), cache)[0],
                                  layernorm_backward(dy, cache_ref)[0])
