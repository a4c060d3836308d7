"""The serial mixture-of-experts layer and its router: the hand-written backward (auxiliary losses included)
against central finite differences in float64, the tie rule, capacity and dropping, shared experts."""

import numpy as np
import pytest

from tpsim.errors import ConfigError
from tpsim.nn import numerical_grad, relative_error
from tpsim.nn.moe import MoE, assignments
from tpsim.nn.router import Router, top_k

TOL = 1e-7


def objective(layer, x, dout):
    """Σ output·dout plus the layer's auxiliary losses: what its backward differentiates."""
    out, cache = layer.forward(x)
    router = cache.router if hasattr(cache, "router") else cache
    first = out[1] if isinstance(out, tuple) else out
    return float(np.sum(first * dout)) + router.aux_loss + router.z_loss


def assert_backward_matches(layer, x, dout_shape):
    """Every parameter's and the input's gradient against finite differences of ``objective``."""
    dout = np.random.default_rng(9).standard_normal(dout_shape)
    out, cache = layer.forward(x)
    layer.zero_grad()
    dx = layer.backward(dout, cache)
    assert relative_error(dx, numerical_grad(lambda: objective(layer, x, dout), x)) < TOL, "input"
    for name, p in layer.named_parameters():
        got = dict(layer.named_grads())[name]
        assert relative_error(got, numerical_grad(lambda: objective(layer, x, dout), p)) < TOL, name


def test_top_k_breaks_ties_towards_the_lower_expert():
    scores = np.array([[0.2, 0.3, 0.3, 0.2], [0.25, 0.25, 0.25, 0.25], [0.1, 0.4, 0.1, 0.4]])
    assert top_k(scores, 2).tolist() == [[1, 2], [0, 1], [1, 3]]


@pytest.mark.parametrize("kind, aux, z", [("softmax", 0.01, 0.001), ("softmax_plain", 0.01, 0.001),
                                          ("sigmoid", 0.0, 0.001)])
def test_router_backward_matches_finite_differences(kind, aux, z):
    rng = np.random.default_rng(1)
    router = Router(6, 5, 2, kind=kind, aux_coef=aux, z_coef=z, rng=rng, std=0.7)
    router.bias[:] = [0.0, 0.3, -0.2, 0.1, 0.0]  # the sigmoid router's selection bias (unused by the others)
    x = rng.standard_normal((7, 6))
    (index, weights), cache = router.forward(x)
    if kind != "softmax_plain":
        assert np.allclose(weights.sum(axis=-1), 1.0)
    assert cache.load.sum() == 7 * 2 and (cache.aux_loss > 0) == (aux > 0) and cache.z_loss > 0
    assert_backward_matches(router, x, (7, 2))


def test_the_sigmoid_routers_bias_chooses_but_does_not_weigh_and_moves_against_the_load():
    router = Router(4, 4, 1, kind="sigmoid", rng=np.random.default_rng(2), std=0.5)
    x = np.random.default_rng(3).standard_normal((5, 4))
    (index, weights), cache = router.forward(x)
    assert np.array_equal(weights, np.ones((5, 1)))  # one choice, normalised among the chosen: 1
    router.bias[:] = [0.0, 0.0, 0.0, 100.0]
    (index, _), _ = router.forward(x)
    assert (index == 3).all()
    router.update_bias(np.array([5, 0, 0, 0]), rate=0.1)
    assert np.allclose(router.bias, [-0.1, 0.1, 0.1, 100.1])
    with pytest.raises(ConfigError, match="selection bias"):
        Router(4, 4, 1, kind="sigmoid", aux_coef=0.01)


@pytest.mark.parametrize("router, shared, gate", [("softmax", 0, False), ("softmax_plain", 1, True),
                                                  ("sigmoid", 2, False)])
def test_moe_backward_matches_finite_differences(router, shared, gate):
    rng = np.random.default_rng(4)
    moe = MoE(6, 5, 4, 2, router=router, shared_experts=shared, shared_ffn=3, shared_gate=gate,
              aux_coef=0.0 if router == "sigmoid" else 0.02, z_coef=0.001, rng=rng, std=0.6)
    x = rng.standard_normal((2, 5, 6))
    assert_backward_matches(moe, x, x.shape)


def test_the_forward_is_the_weighted_sum_of_the_chosen_experts():
    rng = np.random.default_rng(5)
    moe = MoE(6, 5, 4, 2, rng=rng, std=0.6)
    x = rng.standard_normal((9, 6))
    y, cache = moe.forward(x)
    index, weights = cache.router.index, cache.router.weights
    want = np.stack([sum(weights[t, j] * moe.experts[index[t, j]].forward(x[t:t + 1])[0][0] for j in range(2))
                     for t in range(9)])
    assert np.abs(y - want).max() < 1e-14
    assert cache.dropped == 0 and sum(len(r) for r in cache.rows) == 18


def test_capacity_drops_the_later_tokens_and_they_add_nothing():
    index = np.array([[0, 1], [0, 2], [0, 1], [3, 0]])
    rows, slots, dropped = assignments(index, 4, capacity=2)
    assert [r.tolist() for r in rows] == [[0, 1], [0, 2], [1], [3]] and dropped == 2
    assert [s.tolist() for s in slots] == [[0, 0], [1, 1], [1], [0]]
    rng = np.random.default_rng(6)
    moe = MoE(6, 5, 4, 2, capacity_factor=0.5, rng=rng, std=0.6)  # C = ceil(0.5 · 12 · 2 / 4) = 3
    x = rng.standard_normal((12, 6))
    y, cache = moe.forward(x)
    assert moe.capacity(12) == 3 and all(len(r) <= 3 for r in cache.rows)
    assert cache.dropped == 24 - sum(len(r) for r in cache.rows) > 0
    kept = {(int(t), int(j)) for r, s in zip(cache.rows, cache.slots) for t, j in zip(r, s)}
    index, weights = cache.router.index, cache.router.weights
    want = np.stack([sum((weights[t, j] * moe.experts[index[t, j]].forward(x[t:t + 1])[0][0] for j in range(2)
                          if (t, j) in kept), np.zeros(6)) for t in range(12)])
    assert np.abs(y - want).max() < 1e-14
    assert_backward_matches(moe, x, x.shape)
    with pytest.raises(ConfigError, match="capacity factor 0"):
        MoE(6, 5, 4, 2, capacity_factor=0)
    with pytest.raises(ConfigError, match="top-k 5 must be in 1 .. experts"):
        MoE(6, 5, 4, 5)


def test_the_auxiliary_losses_are_per_sequence_and_averaged():
    """A batch of two sequences: L_aux and L_z are the mean of each sequence's alone (the rule every layout
    shares), and the gradients are checked against finite differences above at b = 2."""
    rng = np.random.default_rng(11)
    moe = MoE(6, 5, 4, 2, aux_coef=0.1, z_coef=0.01, rng=rng, std=0.6)
    x = rng.standard_normal((2, 5, 6))
    both = moe.forward(x)[1].router
    one, two = (moe.forward(x[i])[1].router for i in range(2))
    assert abs(both.aux_loss - (one.aux_loss + two.aux_loss) / 2) < 1e-15
    assert abs(both.z_loss - (one.z_loss + two.z_loss) / 2) < 1e-15


def test_capacity_counts_within_each_group_of_tokens():
    """Groups (each rank's tokens under expert parallelism): the capacity is ⌈c·n·k/E⌉ of each group's n tokens
    and the later tokens *of the group* drop; the result is each group's layer run alone."""
    rng = np.random.default_rng(12)
    moe = MoE(6, 5, 4, 2, capacity_factor=0.5, rng=rng, std=0.6)
    x = rng.standard_normal((12, 6))
    groups = [np.array([11, 0, 5, 7, 2, 9]), np.array([1, 3, 4, 6, 8, 10])]
    moe.groups = lambda shape: groups
    y, cache = moe.forward(x)
    moe.groups = None
    for g in groups:
        y_g, c_g = moe.forward(x[g])  # one sequence each; the capacity of 6 tokens
        assert np.abs(y[g] - y_g).max() < 1e-14
    dropped = sum(moe.forward(x[g])[1].dropped for g in groups)
    assert cache.dropped == dropped > 0
    moe.groups = lambda shape: groups
    assert_backward_matches(moe, x, x.shape)
