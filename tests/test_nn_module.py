"""The Module contract on a small tree: dotted names, paths, and a whole MLP checked by the gradcheck helper."""

import numpy as np

from tpsim.nn import GeLU, Linear, Module, check_module_grads, numerical_grad

TOL = 1e-7


class ToyMLP(Module):
    """Linear -> GeLU -> Linear, the shape of a transformer block's MLP."""

    def __init__(self, hidden, ffn, rng):
        super().__init__()
        self.c_fc = Linear(hidden, ffn, rng=rng, std=0.5)
        self.act = GeLU()
        self.c_proj = Linear(ffn, hidden, rng=rng, std=0.5)

    def forward(self, x):
        h, c1 = self.c_fc.forward(x)
        a, c2 = self.act.forward(h)
        y, c3 = self.c_proj.forward(a)
        return y, (c1, c2, c3)

    def backward(self, dout, cache):
        c1, c2, c3 = cache
        return self.c_fc.backward(self.act.backward(self.c_proj.backward(dout, c3), c2), c1)


class Stack(Module):
    def __init__(self, rng):
        super().__init__()
        self.h = [ToyMLP(5, 7, rng), ToyMLP(5, 7, rng)]


def test_named_parameters_give_dotted_names():
    mlp = ToyMLP(5, 7, np.random.default_rng(0))
    names = [name for name, _ in mlp.named_parameters()]
    assert names == ["c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"], names
    stacked = [name for name, _ in Stack(np.random.default_rng(0)).named_parameters("transformer")]
    assert stacked[0] == "transformer.h.0.c_fc.weight" and stacked[-1] == "transformer.h.1.c_proj.bias", stacked
    assert [n for n, _ in mlp.named_grads()] == names


def test_set_path_names_every_submodule():
    stack = Stack(np.random.default_rng(0)).set_path("transformer")
    assert stack.path == "transformer"
    assert stack.h[1].path == "transformer.h.1"
    assert stack.h[1].c_proj.path == "transformer.h.1.c_proj"
    assert stack.h[0].act.path == "transformer.h.0.act"


def test_mlp_grads_match_finite_differences_through_three_layers():
    rng = np.random.default_rng(1)
    mlp = ToyMLP(17, 13, rng)
    errors = check_module_grads(mlp, rng.standard_normal((2, 3, 5, 17)))
    assert set(errors) == {"input", "c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"}
    for name, err in errors.items():
        assert err < TOL, f"{name}: max relative error {err:.3e} vs finite differences"


def test_numerical_grad_is_accurate_and_restores_input():
    x = np.random.default_rng(2).standard_normal((3, 4))
    before = x.copy()
    g = numerical_grad(lambda: float(np.sum(x**3)), x)
    assert np.array_equal(x, before), "numerical_grad must restore x exactly"
    err = np.abs(g - 3 * x**2).max()
    assert err < 1e-8, f"d(sum x^3)/dx off by {err:.3e}"


def test_gradcheck_catches_a_wrong_backward():
    class Broken(Linear):
        def backward(self, dout, cache):
            dx = super().backward(dout, cache)
            self.grads["bias"] *= 0.5  # a plausible bug: a stray factor
            return dx

    errors = check_module_grads(Broken(5, 3), np.random.default_rng(3).standard_normal((4, 5)))
    assert errors["bias"] > 0.1, f"a halved bias grad should be caught, error was {errors['bias']:.3e}"
    assert errors["weight"] < TOL and errors["input"] < TOL
