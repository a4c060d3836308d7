"""The Module contract on a small tree: dotted names, paths, a whole MLP checked by the gradcheck helper, and the
generic hooks around a layer's calls (``tpsim.nn.hooks``)."""

import numpy as np
import pytest

from tpsim.nn import GeLU, Linear, Module, check_module_grads, numerical_grad
from tpsim.nn.hooks import BACKWARD, FORWARD, WEIGHT_GRAD, Hook
from tpsim.nn.module import deferred_weight_grads

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


# --- hooks ---------------------------------------------------------------------------------------------------------
def recording(log: list, name: str, events=(FORWARD, BACKWARD, WEIGHT_GRAD)) -> Hook:
    """A hook that writes ``(name, "before"/"after", event, module path)`` into ``log``."""
    return Hook(tuple(events), before=lambda m, e: log.append((name, "before", e, m.path)),
                after=lambda m, e: log.append((name, "after", e, m.path)))


def test_hooks_run_in_registration_order_before_and_after_the_call():
    layer = Linear(3, 2).set_path("fc")
    log = []
    layer.register_hook(recording(log, "a"))
    layer.register_hook(recording(log, "b"))
    with layer.hooked(FORWARD):
        log.append("the call")
    assert log == [("a", "before", FORWARD, "fc"), ("b", "before", FORWARD, "fc"), "the call",
                   ("a", "after", FORWARD, "fc"), ("b", "after", FORWARD, "fc")], log


def test_a_hook_hears_only_its_events_and_a_raising_call_skips_the_afters():
    layer = Linear(3, 2).set_path("fc")
    log = []
    layer.register_hook(recording(log, "w", events=(WEIGHT_GRAD,)))
    with layer.hooked(FORWARD):
        pass
    assert log == [], "a weight_grad hook ran around a forward"
    with pytest.raises(ZeroDivisionError):
        with layer.hooked(WEIGHT_GRAD):
            1 / 0
    assert log == [("w", "before", WEIGHT_GRAD, "fc")], log
    with pytest.raises(ValueError, match="a hook listens to some of"):
        Hook(("forwards",))


def test_removing_a_hook_takes_it_off_once_and_for_all():
    layer = Linear(3, 2)
    log = []
    first = layer.register_hook(recording(log, "a"))
    layer.register_hook(recording(log, "b"))
    first.remove()
    first.remove()  # a second remove does nothing
    with layer.hooked(BACKWARD):
        pass
    assert [entry[0] for entry in log] == ["b", "b"], log
    assert len(layer.hooks) == 1


def test_a_hook_may_take_itself_off_while_the_hooks_run():
    """ZeRO-1's parameter waits do: the last all-gather done, every layer's wait goes, the running one too."""
    layer, log = Linear(3, 2), []
    handle = layer.register_hook(Hook((FORWARD,), before=lambda m, e: handle.remove()))
    layer.register_hook(recording(log, "next", events=(FORWARD,)))
    with layer.hooked(FORWARD):
        pass
    assert [entry[1] for entry in log] == ["before", "after"] and len(layer.hooks) == 1


def test_weight_grad_hooks_run_where_the_weight_gradient_really_runs():
    """A plain backward: around the W inside the backward. A split one (ZB-H1): nothing at B, everything at W."""
    rng = np.random.default_rng(4)
    mlp = ToyMLP(5, 7, rng).set_path("mlp")
    x, dy = rng.standard_normal((2, 5)), rng.standard_normal((2, 5))
    log = []
    for layer in (mlp.c_fc, mlp.c_proj):
        layer.register_hook(recording(log, "w", events=(WEIGHT_GRAD,)))
    _, cache = mlp.forward(x)
    mlp.backward(dy, cache)
    at_once = [(when, path) for _, when, _, path in log]
    assert at_once == [("before", "mlp.c_proj"), ("after", "mlp.c_proj"), ("before", "mlp.c_fc"),
                       ("after", "mlp.c_fc")], at_once
    log.clear()
    with deferred_weight_grads(mlp) as w:
        mlp.backward(dy, cache)
    assert log == [], f"hooks ran at B: {log}"
    seen = []
    mlp.c_proj.register_hook(Hook((WEIGHT_GRAD,), after=lambda m, e: seen.append(np.any(m.grads["weight"]))))
    mlp.zero_grad()
    w.run()
    assert [(when, path) for _, when, _, path in log] == at_once and seen == [True], (log, seen)
