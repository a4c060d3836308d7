"""SGD and AdamW against plain reference updates written out below, on a tiny MLP in float64.

Each story: run the optimizer for three steps of forward/backward/step, replay the same gradients through the
reference formula on copies of the parameters, and compare (rtol 1e-14). Then the bookkeeping: zero_grad,
checkpoints that continue the exact trajectory, tied weights updated once, and argument checks.
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.nn import MLP, Linear, Module
from tpsim.train import SGD, AdamW

RTOL = 1e-14
LRS = [0.05, 0.02, 0.03]  # a changing lr: the optimizer must read ``lr`` afresh every step


def make_mlp(seed: int = 0) -> MLP:
    return MLP(5, 7, rng=np.random.default_rng(seed), std=0.5)


def fwd_bwd(model: Module, step: int) -> None:
    """One forward/backward with fresh grads; the input depends on the step so the gradients do too."""
    rng = np.random.default_rng(100 + step)
    x, dz = rng.standard_normal((3, 5)), rng.standard_normal((3, 5))
    model.zero_grad()
    z, cache = model.forward(x)
    model.backward(dz, cache)


def params_of(model: Module) -> dict[str, np.ndarray]:
    return {name: p.copy() for name, p in model.named_parameters()}


def assert_params(model: Module, ref: dict[str, np.ndarray], what: str) -> None:
    for name, p in model.named_parameters():
        d = np.max(np.abs(p - ref[name]) / np.abs(ref[name]))
        assert d <= RTOL, f"{what}: {name} max relative diff {d:.3e}"


def is_bias(name: str) -> bool:
    return name.endswith("bias")


# --- reference updates: the textbook formulas, one parameter at a time ------------------------------------------
def ref_sgd(p, g, buf, lr, momentum, nesterov, wd):
    g = g + wd * p
    if momentum:
        buf = g if buf is None else momentum * buf + g
        g = g + momentum * buf if nesterov else buf
    return p - lr * g, buf


def ref_adamw(p, g, m, v, t, lr, betas, eps, wd):
    b1, b2 = betas
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g**2
    m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
    return p - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


@pytest.mark.parametrize("momentum,nesterov,wd", [(0.0, False, 0.0), (0.0, False, 0.1), (0.9, False, 0.0),
                                                  (0.9, True, 0.0), (0.9, False, 0.1), (0.8, True, 0.1)])
def test_sgd_matches_reference(momentum, nesterov, wd):
    model = make_mlp()
    opt = SGD(model, lr=LRS[0], momentum=momentum, weight_decay=wd, nesterov=nesterov)
    ref, bufs = params_of(model), {}
    for t, lr in enumerate(LRS):
        fwd_bwd(model, t)
        for name, g in model.named_grads():
            ref[name], bufs[name] = ref_sgd(ref[name], g, bufs.get(name), lr, momentum, nesterov, wd)
        opt.lr = lr
        opt.step()
        assert_params(model, ref, f"SGD step {t + 1}")


@pytest.mark.parametrize("wd,no_decay", [(0.0, None), (0.1, None), (0.1, is_bias)])
def test_adamw_matches_reference(wd, no_decay):
    model = make_mlp()
    betas, eps = (0.8, 0.95), 1e-8
    opt = AdamW(model, lr=LRS[0], betas=betas, eps=eps, weight_decay=wd, no_decay=no_decay)
    ref = params_of(model)
    m = {k: np.zeros_like(v) for k, v in ref.items()}
    v = {k: np.zeros_like(x) for k, x in ref.items()}
    for t, lr in enumerate(LRS, start=1):
        fwd_bwd(model, t)
        for name, g in model.named_grads():
            decay = 0.0 if no_decay is not None and no_decay(name) else wd
            ref[name], m[name], v[name] = ref_adamw(ref[name], g, m[name], v[name], t, lr, betas, eps, decay)
        opt.lr = lr
        opt.step()
        assert_params(model, ref, f"AdamW step {t}")
    assert opt.step_count == 3


def test_adamw_matches_torch():
    torch = pytest.importorskip("torch")
    model = make_mlp()
    tparams = [torch.tensor(p.copy(), requires_grad=True) for _, p in model.named_parameters()]
    topt = torch.optim.AdamW(tparams, lr=1e-2, betas=(0.8, 0.95), eps=1e-8, weight_decay=0.1)
    opt = AdamW(model, lr=1e-2, betas=(0.8, 0.95), eps=1e-8, weight_decay=0.1)
    for t in range(3):
        fwd_bwd(model, t)
        for tp, (_, g) in zip(tparams, model.named_grads()):
            tp.grad = torch.tensor(g.copy())
        topt.step()
        opt.step()
    assert_params(model, {n: tp.detach().numpy() for (n, _), tp in zip(model.named_parameters(), tparams)}, "torch")


@pytest.mark.parametrize("make_opt", [lambda m: SGD(m, 0.1, momentum=0.9, weight_decay=0.1),
                                      lambda m: AdamW(m, 0.1)], ids=["sgd", "adamw"])
def test_step_leaves_grads_alone_and_zero_grad_clears_them(make_opt):
    model = make_mlp()
    opt = make_opt(model)
    fwd_bwd(model, 0)
    grads = {name: g.copy() for name, g in model.named_grads()}
    opt.step()
    for name, g in model.named_grads():  # weight decay must not have been folded into the module's grad
        np.testing.assert_array_equal(g, grads[name], err_msg=name)
    opt.zero_grad()
    assert all(not g.any() for _, g in model.named_grads())


@pytest.mark.parametrize("make_opt", [lambda m: SGD(m, 0.05, momentum=0.9, nesterov=True, weight_decay=0.1),
                                      lambda m: AdamW(m, 0.05, weight_decay=0.1)], ids=["sgd", "adamw"])
def test_state_dict_round_trip_continues_the_same_trajectory(make_opt):
    model = make_mlp()
    opt = make_opt(model)
    for t in range(2):
        fwd_bwd(model, t)
        opt.step()
    saved_params, saved = params_of(model), opt.state_dict()
    for t in range(2, 4):  # the uninterrupted run
        fwd_bwd(model, t)
        opt.step()
    name = opt.param_names[0]
    slot = next(iter(opt.state[name]))
    assert saved["step"] == 2
    assert not np.array_equal(saved["state"][name][slot], opt.state[name][slot]), "state_dict must be a copy"

    resumed = make_mlp(seed=1)  # other initial weights: everything must come from the checkpoint
    for name, p in resumed.named_parameters():
        p[...] = saved_params[name]
    opt2 = make_opt(resumed)
    opt2.load_state_dict(saved)
    for t in range(2, 4):
        fwd_bwd(resumed, t)
        opt2.step()
    for (name, a), (_, b) in zip(model.named_parameters(), resumed.named_parameters()):
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert opt2.step_count == 4


def test_load_state_dict_rejects_mismatches():
    opt = AdamW(make_mlp(), 0.1)
    sd = opt.state_dict()
    bad_shape = {"step": 1, "state": {k: dict(v) for k, v in sd["state"].items()}}
    name = opt.param_names[0]
    bad_shape["state"][name]["exp_avg"] = np.zeros((1, 1))
    with pytest.raises(ValueError, match="shape"):
        opt.load_state_dict(bad_shape)
    with pytest.raises(ValueError, match="do not match"):
        opt.load_state_dict({"step": 1, "state": {}})
    with pytest.raises(ValueError, match="slots"):
        SGD(make_mlp(), 0.1, momentum=0.9).load_state_dict(sd)


class Tied(Module):
    """Two linear layers sharing one weight array (and its gradient buffer), like a GPT's wte and lm_head."""

    def __init__(self, share_grad: bool = True):
        super().__init__()
        self.a = Linear(4, 4, rng=np.random.default_rng(0), std=0.5)
        self.b = Linear(4, 4, rng=np.random.default_rng(1), std=0.5)
        self.b.params["weight"] = self.a.params["weight"]
        if share_grad:
            self.b.grads["weight"] = self.a.grads["weight"]

    def forward(self, x):
        y, ca = self.a.forward(x)
        z, cb = self.b.forward(y)
        return z, (ca, cb)

    def backward(self, dz, cache):
        ca, cb = cache
        return self.a.backward(self.b.backward(dz, cb), ca)


def test_tied_weight_is_updated_once_with_both_contributions():
    model = Tied()
    opt = SGD(model, lr=0.1)
    assert opt.param_names == ["a.weight", "a.bias", "b.bias"]
    w = model.a.params["weight"]
    w0 = w.copy()
    rng = np.random.default_rng(5)
    z, cache = model.forward(rng.standard_normal((3, 4)))
    model.backward(rng.standard_normal((3, 4)), cache)
    g = model.a.grads["weight"].copy()  # holds the sum of both layers' contributions
    opt.step()
    np.testing.assert_array_equal(w, w0 - 0.1 * g)  # once: twice would be w0 - 0.2·g
    assert model.b.params["weight"] is w
    assert len(AdamW(model).state) == 3


def test_tied_weight_with_separate_grad_buffers_is_rejected():
    with pytest.raises(ValueError, match="two gradient buffers"):
        SGD(Tied(share_grad=False), lr=0.1)


def test_state_bytes():
    model = make_mlp()
    n = sum(p.nbytes for _, p in model.named_parameters())
    assert SGD(model, 0.1).state_bytes() == 0
    assert SGD(model, 0.1, momentum=0.9).state_bytes() == n
    assert AdamW(model).state_bytes() == 2 * n


@pytest.mark.parametrize("build,match", [
    (lambda m: SGD(m, lr=-1.0), "lr"),
    (lambda m: SGD(m, lr=float("nan")), "lr"),
    (lambda m: SGD(m, lr=0.1, momentum=-0.1), "momentum"),
    (lambda m: SGD(m, lr=0.1, nesterov=True), "nesterov"),
    (lambda m: SGD(m, lr=0.1, weight_decay=-1e-3), "weight_decay"),
    (lambda m: AdamW(m, lr=-1e-3), "lr"),
    (lambda m: AdamW(m, betas=(1.0, 0.999)), r"betas\[0\]"),
    (lambda m: AdamW(m, betas=(0.9, -0.1)), r"betas\[1\]"),
    (lambda m: AdamW(m, eps=-1e-8), "eps"),
    (lambda m: AdamW(m, weight_decay=-0.01), "weight_decay"),
])
def test_arguments_are_validated(build, match):
    with pytest.raises(ValueError, match=match):
        build(make_mlp())


def test_lr_setter_is_validated():
    opt = AdamW(make_mlp())
    opt.lr = 0.0  # allowed: a schedule may warm up from zero
    with pytest.raises(ValueError, match="lr"):
        opt.lr = -0.5
