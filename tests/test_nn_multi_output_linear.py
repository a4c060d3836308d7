"""MultiOutputLinear: several Linears reading one input as one layer — its backward against finite differences,
each part's own gradient, and the parts named as the parent's own (the layer is inline)."""

import numpy as np
import pytest

from tpsim.nn import Linear, Module, MultiOutputLinear, numerical_grad, relative_error

TOL = 1e-7


def parts(rng, bias):
    return {"q_proj": Linear(11, 13, bias=bias, rng=rng, std=0.5),
            "k_proj": Linear(11, 5, bias=bias, rng=rng, std=0.5),
            "v_proj": Linear(11, 7, bias=bias, rng=rng, std=0.5)}


@pytest.mark.parametrize("bias", [True, False])
def test_multi_output_linear_grads_match_finite_differences(bias):
    rng = np.random.default_rng(0)
    layer = MultiOutputLinear(parts(rng, bias))
    x = rng.standard_normal((2, 3, 11))
    outs, caches = layer.forward(x)
    douts = [rng.standard_normal(y.shape) for y in outs]

    def scalar() -> float:  # L = Σ_j ⟨y_j, dy_j⟩: its gradients are what backward returns and adds
        return float(sum(np.sum(y * dy) for y, dy in zip(layer.forward(x)[0], douts)))

    layer.zero_grad()
    dx = layer.backward(douts, caches)
    errors = {"input": relative_error(dx, numerical_grad(scalar, x))}
    analytic = {name: g.copy() for name, g in layer.named_grads()}
    for name, param in layer.named_parameters():
        errors[name] = relative_error(analytic[name], numerical_grad(scalar, param))
    expected = {"input"} | {f"{p}_proj.{w}" for p in "qkv" for w in (("weight", "bias") if bias else ("weight",))}
    assert set(errors) == expected, sorted(errors)
    for name, err in errors.items():
        assert err < TOL, f"{name}: max relative error {err:.3e} vs finite differences"


def test_multi_output_linear_is_its_parts_run_one_by_one():
    rng = np.random.default_rng(1)
    layer, x = MultiOutputLinear(parts(rng, True)), rng.standard_normal((4, 11))
    outs, _ = layer.forward(x)
    for y, part in zip(outs, layer.parts().values()):
        assert np.array_equal(y, part.forward(x)[0]), "the same arithmetic as the part alone (bit for bit)"


def test_parts_are_named_as_the_parents_own():
    class Attention(Module):
        def __init__(self):
            super().__init__()
            self.qkv = MultiOutputLinear(parts(np.random.default_rng(2), False))
            self.o_proj = Linear(13, 11, bias=False)

    attn = Attention().set_path("model.layers.0.self_attn")
    assert [n for n, _ in attn.named_parameters()] == [f"{p}_proj.weight" for p in "qkvo"]
    assert attn.qkv.path == attn.path, "inline: the layer's scope is its parent's"
    assert attn.qkv.k_proj.path == "model.layers.0.self_attn.k_proj"


def test_parts_must_read_one_input():
    with pytest.raises(ValueError, match="one input"):
        MultiOutputLinear({"a": Linear(4, 3), "b": Linear(5, 3)})
    with pytest.raises(ValueError, match="at least one part"):
        MultiOutputLinear({})
