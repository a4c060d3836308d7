"""Llama's serial layers: RMSNorm, SiLU, SwiGLU, RoPE, grouped-query attention — hand-written backward vs
central finite differences in float64, and what each forward promises."""

import numpy as np
import pytest

from tpsim.nn import check_module_grads, numerical_grad, relative_error
from tpsim.nn.gqa_attention import GQAttention
from tpsim.nn.rmsnorm import RMSNorm
from tpsim.nn.rope import rope_backward, rope_cos_sin, rope_forward, rotate_half
from tpsim.nn.silu import SiLU, silu_forward
from tpsim.nn.swiglu import SwiGLU

TOL = 1e-7


def assert_grads(errors, names):
    assert set(errors) == set(names), sorted(errors)
    for name, err in errors.items():
        assert err < TOL, f"{name}: max relative error {err:.3e} vs finite differences"


@pytest.mark.parametrize("shape", [(13, 17), (2, 3, 17)])
def test_rmsnorm_grads_match_finite_differences(shape):
    rng = np.random.default_rng(0)
    norm = RMSNorm(17)
    norm.params["weight"][:] = rng.standard_normal(17)
    x = 2.0 + 3.0 * rng.standard_normal(shape)
    assert_grads(check_module_grads(norm, x), {"input", "weight"})


def test_rmsnorm_forward_gives_unit_rms():
    x = 50.0 * np.random.default_rng(1).standard_normal((3, 5, 17))
    y, cache = RMSNorm(17, eps=0.0).forward(x)
    rms_err = np.abs(np.sqrt(np.square(y).mean(-1)) - 1).max()
    assert rms_err < 1e-12, f"row rms off 1 by {rms_err:.3e}"
    assert cache.PARAMETERS == ("w",) and cache.rstd.shape == (3, 5, 1)
    assert RMSNorm(4).eps == 1e-6 and set(RMSNorm(4).params) == {"weight"}


def test_silu_grads_and_no_overflow():
    x = np.random.default_rng(2).standard_normal((4, 9)) * 3
    assert_grads(check_module_grads(SiLU(), x), {"input"})
    with np.errstate(over="raise", invalid="raise"):  # e^(−|x|) never overflows (it may underflow to 0)
        y, _ = silu_forward(np.array([-1000.0, -30.0, 0.0, 30.0, 1000.0]))
    assert y[0] == 0.0 and y[-1] == 1000.0 and abs(y[1] + 30 / (1 + np.exp(30))) < 1e-25


def test_swiglu_grads_match_finite_differences():
    rng = np.random.default_rng(3)
    mlp = SwiGLU(6, 10, rng=rng, std=0.5)
    x = rng.standard_normal((2, 3, 6))
    assert_grads(check_module_grads(mlp, x), {"input", "gate_proj.weight", "up_proj.weight", "down_proj.weight"})
    assert not any(m.has_bias for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))


def test_swiglu_forward_is_down_of_silu_gate_times_up():
    rng = np.random.default_rng(4)
    mlp = SwiGLU(6, 10, rng=rng, std=0.5)
    x = rng.standard_normal((5, 6))
    g, u = x @ mlp.gate_proj.params["weight"], x @ mlp.up_proj.params["weight"]
    expected = (g / (1 + np.exp(-g)) * u) @ mlp.down_proj.params["weight"]
    assert np.abs(mlp.forward(x)[0] - expected).max() < 1e-14


def test_rope_is_a_rotation_with_relative_positions():
    rng = np.random.default_rng(5)
    d = 8
    q, k = rng.standard_normal(d), rng.standard_normal(d)
    cos, sin = rope_cos_sin(np.arange(20), d, theta=10000.0)
    rq = lambda pos: rope_forward(q, cos[pos], sin[pos])[0]  # noqa: E731
    rk = lambda pos: rope_forward(k, cos[pos], sin[pos])[0]  # noqa: E731
    assert abs(np.linalg.norm(rq(7)) - np.linalg.norm(q)) < 1e-13  # a rotation keeps the norm
    # the score depends on the positions only through their difference (RoFormer's point)
    assert abs(rq(9) @ rk(4) - rq(15) @ rk(10)) < 1e-12
    assert np.array_equal(rotate_half(np.arange(4.0)), [-2.0, -3.0, 0.0, 1.0])  # [x1|x2] -> [-x2|x1]
    assert np.array_equal(rq(0), q)  # position 0: no rotation


def test_rope_backward_matches_finite_differences():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 5, 6))
    cos, sin = rope_cos_sin(np.arange(5), 6, theta=100.0)
    dy = rng.standard_normal(x.shape)
    dx = rope_backward(dy, rope_forward(x, cos, sin)[1])
    numeric = numerical_grad(lambda: float(np.sum(rope_forward(x, cos, sin)[0] * dy)), x)
    assert relative_error(dx, numeric) < TOL
    with pytest.raises(ValueError, match="even"):
        rope_cos_sin(np.arange(3), 5)


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 1), (2, 2)])
def test_gqa_attention_grads_match_finite_differences(heads, kv_heads):
    rng = np.random.default_rng(7)
    attn = GQAttention(8, heads, kv_heads, rope_theta=50.0, rng=rng, std=0.5)
    x = rng.standard_normal((2, 5, 8))
    assert_grads(check_module_grads(attn, x),
                 {"input"} | {f"{p}_proj.weight" for p in "qkvo"})


def test_gqa_equals_mha_with_each_kv_head_copied():
    """GQA = multi-head attention whose k/v heads are copies: query head j reads KV head j // n_rep."""
    rng = np.random.default_rng(8)
    gqa = GQAttention(8, 4, 2, rng=rng, std=0.5)
    mha = GQAttention(8, 4, 4, rng=rng)
    for name in ("q_proj", "o_proj"):
        getattr(mha, name).params["weight"][...] = getattr(gqa, name).params["weight"]
    for name in ("k_proj", "v_proj"):
        w = getattr(gqa, name).params["weight"].reshape(8, 2, 1, 2)  # [h, kv, 1, hd]
        getattr(mha, name).params["weight"][...] = np.repeat(w, 2, axis=2).reshape(8, 8)
    x = rng.standard_normal((2, 5, 8))
    assert np.abs(gqa.forward(x)[0] - mha.forward(x)[0]).max() < 1e-14


def test_gqa_attention_is_causal_and_checks_sizes():
    rng = np.random.default_rng(9)
    attn = GQAttention(8, 4, 2, rng=rng, std=0.5)
    x = rng.standard_normal((1, 6, 8))
    x2 = x.copy()
    x2[:, 4:] += 1.0  # change the future: positions 0..3 must not see it
    assert np.abs(attn.forward(x)[0][:, :4] - attn.forward(x2)[0][:, :4]).max() < 1e-15
    for bad in ((8, 3, 1), (8, 4, 3), (12, 4, 2)):  # hidden % heads, heads % kv, odd head_dim
        with pytest.raises(ValueError):
            GQAttention(*bad)
