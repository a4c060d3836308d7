"""Nemotron's serial layers: squared ReLU and its MLP, LayerNorm1P, partial RoPE, attention turning half of each
head, and the whole serial model — hand-written backward vs central finite differences in float64, and what each
forward promises."""

import numpy as np
import pytest

from tpsim.arch.nemotron import NemotronConfig
from tpsim.errors import ConfigError
from tpsim.models.nemotron import serial_nemotron
from tpsim.nn import check_module_grads, numerical_grad, relative_error
from tpsim.nn.gqa_attention import GQAttention
from tpsim.nn.layernorm import LayerNorm
from tpsim.nn.layernorm_1p import LayerNorm1P
from tpsim.nn.relu2 import SquaredReluMLP, relu2_backward, relu2_forward
from tpsim.nn.rope import partial_rope_backward, partial_rope_forward, rope_cos_sin, rope_forward

TOL = 1e-7


def assert_grads(errors, names):
    assert set(errors) == set(names), sorted(errors)
    for name, err in errors.items():
        assert err < TOL, f"{name}: max relative error {err:.3e} vs finite differences"


def test_relu2_is_the_square_of_relu_and_its_derivative():
    x = np.array([-2.0, -0.5, 0.0, 0.5, 3.0])
    y, cache = relu2_forward(x)
    assert np.array_equal(y, [0.0, 0.0, 0.0, 0.25, 9.0])
    assert np.array_equal(relu2_backward(np.ones(5), cache), [0.0, 0.0, 0.0, 1.0, 6.0])
    x = np.random.default_rng(0).standard_normal((4, 7)) + 0.1  # no entry at the kink
    dy = np.random.default_rng(1).standard_normal(x.shape)
    numeric = numerical_grad(lambda: float(np.sum(relu2_forward(x)[0] * dy)), x)
    assert relative_error(relu2_backward(dy, relu2_forward(x)[1]), numeric) < TOL


def test_squared_relu_mlp_grads_match_finite_differences_and_its_forward():
    rng = np.random.default_rng(2)
    mlp = SquaredReluMLP(6, 12, rng=rng, std=0.5)
    x = rng.standard_normal((2, 3, 6))
    assert_grads(check_module_grads(mlp, x), {"input", "up_proj.weight", "down_proj.weight"})
    assert not any(m.has_bias for m in (mlp.up_proj, mlp.down_proj))
    u = x @ mlp.up_proj.params["weight"]
    assert np.abs(mlp.forward(x)[0] - np.maximum(u, 0) ** 2 @ mlp.down_proj.params["weight"]).max() < 1e-14


def test_layernorm_1p_scales_by_one_plus_weight_and_its_grads():
    rng = np.random.default_rng(3)
    ln1p = LayerNorm1P(9)
    assert np.array_equal(ln1p.params["weight"], np.zeros(9)) and np.array_equal(ln1p.params["bias"], np.zeros(9))
    ln1p.params["weight"][:] = rng.standard_normal(9)
    ln1p.params["bias"][:] = rng.standard_normal(9)
    plain = LayerNorm(9)
    plain.params["weight"][:] = 1 + ln1p.params["weight"]
    plain.params["bias"][:] = ln1p.params["bias"]
    x = 2.0 + 3.0 * rng.standard_normal((2, 4, 9))
    assert np.array_equal(ln1p.forward(x)[0], plain.forward(x)[0])
    assert_grads(check_module_grads(ln1p, x), {"input", "weight", "bias"})
    assert ln1p.forward(x)[1].PARAMETERS == ("w",)  # the effective scale is a parameter's, not an activation


def test_partial_rope_turns_only_the_first_features():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 5, 8))
    cos, sin = rope_cos_sin(np.arange(5), 4, theta=100.0)
    y, cache = partial_rope_forward(x, cos, sin)
    assert np.array_equal(y[..., 4:], x[..., 4:])
    assert np.array_equal(y[..., :4], rope_forward(x[..., :4], cos, sin)[0])
    full_cos, full_sin = rope_cos_sin(np.arange(5), 8, theta=100.0)
    assert np.array_equal(partial_rope_forward(x, full_cos, full_sin)[0], rope_forward(x, full_cos, full_sin)[0])
    dy = rng.standard_normal(x.shape)
    numeric = numerical_grad(lambda: float(np.sum(partial_rope_forward(x, cos, sin)[0] * dy)), x)
    assert relative_error(partial_rope_backward(dy, cache), numeric) < TOL


@pytest.mark.parametrize("heads,kv_heads", [(2, 1), (2, 2)])
def test_attention_with_half_rotary_grads_match_finite_differences(heads, kv_heads):
    rng = np.random.default_rng(5)
    attn = GQAttention(16, heads, kv_heads, rope_theta=50.0, rng=rng, std=0.5, rotary_dim=4)
    assert attn.rotary_dim == 4 and attn.head_dim == 16 // heads
    x = rng.standard_normal((2, 5, 16))
    assert_grads(check_module_grads(attn, x), {"input"} | {f"{p}_proj.weight" for p in "qkvo"})
    with pytest.raises(ValueError, match="rotary_dim = 3 must be even"):
        GQAttention(16, 2, 1, rotary_dim=3)


def config(**kw) -> NemotronConfig:
    sizes = dict(vocab_size=11, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, max_position_embeddings=8, rope_theta=100.0, initializer_range=0.4)
    return NemotronConfig(**{**sizes, **kw})


def test_the_serial_model_grads_match_finite_differences():
    """The whole model's loss against central differences, on a sample of every parameter's entries (norm
    weights and biases moved off their zeros so their gradients are not trivially at a symmetric point)."""
    cfg = config()
    model = serial_nemotron(cfg, seed=1)
    rng = np.random.default_rng(6)
    for name, p in model.named_parameters():
        if "layernorm" in name or name.startswith("model.norm"):
            p[...] = 0.3 * rng.standard_normal(p.shape)
    ids, labels = rng.integers(0, 11, (2, 6)), rng.integers(0, 11, (2, 6))
    model.loss_and_grads(ids, labels)
    grads = {n: g.copy() for n, g in model.named_grads()}
    for name, p in model.named_parameters():
        flat = p.reshape(-1)
        for i in rng.choice(flat.size, size=min(4, flat.size), replace=False):
            old, eps = flat[i], 1e-6
            flat[i] = old + eps
            up = model.forward(ids, labels)[0]
            flat[i] = old - eps
            down = model.forward(ids, labels)[0]
            flat[i] = old
            numeric = (up - down) / (2 * eps)
            got = grads[name].reshape(-1)[i]
            assert abs(got - numeric) <= 1e-6 * max(1.0, abs(numeric)), f"{name}[{i}]: {got} vs {numeric}"


def test_config_checks_and_hugging_face_round_trip():
    from tpsim.arch.nemotron_hf import read_config
    cfg = config()
    assert cfg.rotary_dim == 4 and read_config(cfg.hf_config()) == cfg
    with pytest.raises(ConfigError, match="RoPE turns partial_rotary_factor x head_dim = 1"):
        config(partial_rotary_factor=0.125).check()
    with pytest.raises(ConfigError, match="intermediate_size 24 is not divisible by tp 5"):
        config(num_attention_heads=5, hidden_size=20, num_key_value_heads=5).check(5)
    with pytest.raises(ConfigError, match="hidden_act"):
        read_config({**cfg.hf_config(), "hidden_act": "gelu"})
