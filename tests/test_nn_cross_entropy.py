"""Softmax cross-entropy: the fused gradient against finite differences, padding, label smoothing, huge logits."""

import numpy as np
import pytest

from tpsim.nn import (
    CrossEntropyLoss,
    check_module_grads,
    softmax_cross_entropy_backward,
    softmax_cross_entropy_forward,
)

TOL = 1e-7


def direct_loss(logits, targets, ignore_index=-100, eps=0.0):
    """The textbook formula row by row, no max-trick: only for moderate logits."""
    losses = []
    for z, t in zip(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)):
        if t == ignore_index:
            continue
        logp = z - np.log(np.sum(np.exp(z)))
        losses.append((1 - eps) * -logp[t] + eps * np.mean(-logp))
    return float(np.mean(losses)) if losses else 0.0


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_loss_matches_direct_formula(eps):
    rng = np.random.default_rng(0)
    logits, targets = rng.standard_normal((13, 17)), rng.integers(0, 17, 13)
    targets[[2, 7]] = -100
    loss, _ = softmax_cross_entropy_forward(logits, targets, label_smoothing=eps)
    ref = direct_loss(logits, targets, eps=eps)
    assert abs(loss - ref) < 1e-13, f"loss {loss!r} vs direct {ref!r}"


@pytest.mark.parametrize("lead", [(13,), (2, 3, 5)])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_grad_matches_finite_differences(lead, eps):
    rng = np.random.default_rng(1)
    logits = 2.0 * rng.standard_normal((*lead, 11))
    targets = rng.integers(0, 11, lead)
    targets.reshape(-1)[::4] = -1  # a non-default ignore_index, every fourth row padding
    errors = check_module_grads(CrossEntropyLoss(ignore_index=-1, label_smoothing=eps), logits, targets)
    assert errors["input"] < TOL, f"dlogits max relative error {errors['input']:.3e}"


def test_ignored_rows_get_zero_grad_and_loss_is_mean_over_the_rest():
    rng = np.random.default_rng(2)
    logits, targets = rng.standard_normal((13, 17)), rng.integers(0, 17, 13)
    ignored = np.array([0, 4, 5, 12])
    targets[ignored] = -100
    loss, cache = softmax_cross_entropy_forward(logits, targets)
    kept = np.setdiff1d(np.arange(13), ignored)
    loss_kept, _ = softmax_cross_entropy_forward(logits[kept], targets[kept])
    assert abs(loss - loss_kept) < 1e-14, f"loss {loss} vs mean over the 9 kept rows {loss_kept}"
    dlogits = softmax_cross_entropy_backward(1.0, cache)
    assert not dlogits[ignored].any(), "ignored rows must get exactly zero gradient"
    row_sums = np.abs(dlogits[kept].sum(-1)).max()
    assert row_sums < 1e-15, f"each kept row's gradient sums to zero (p - onehot), off by {row_sums:.3e}"


def test_all_ignored_gives_zero_loss_and_zero_grad():
    logits = np.random.default_rng(3).standard_normal((4, 7))
    loss, cache = softmax_cross_entropy_forward(logits, np.full(4, -100), label_smoothing=0.1)
    dlogits = softmax_cross_entropy_backward(1.0, cache)
    assert loss == 0.0 and np.isfinite(dlogits).all() and not dlogits.any(), f"loss {loss}, grads not zero"


def test_huge_logits_stay_finite_and_grad_is_p_minus_onehot():
    rng = np.random.default_rng(4)
    logits, targets = 1000.0 * rng.standard_normal((13, 17)), rng.integers(0, 17, 13)
    loss, cache = softmax_cross_entropy_forward(logits, targets, label_smoothing=0.1)
    dlogits = softmax_cross_entropy_backward(1.0, cache)
    assert np.isfinite(loss) and np.isfinite(dlogits).all(), "logits x1000 overflowed"
    probs = np.zeros_like(logits)
    probs[np.arange(13), logits.argmax(-1)] = 1.0  # at this scale softmax is one-hot up to exp(-hundreds)
    onehot = np.eye(17)[targets]
    expected = (probs - 0.9 * onehot - 0.1 / 17) / 13
    assert np.abs(dlogits - expected).max() < 1e-12, f"max diff {np.abs(dlogits - expected).max():.3e}"


def test_module_wrapper_and_dloss_scaling():
    rng = np.random.default_rng(5)
    logits, targets = rng.standard_normal((2, 3, 5, 11)), rng.integers(0, 11, (2, 3, 5))
    ce = CrossEntropyLoss(label_smoothing=0.2)
    loss, cache = ce.forward(logits, targets)
    loss_fn, cache_fn = softmax_cross_entropy_forward(logits, targets, label_smoothing=0.2)
    assert isinstance(loss, float) and loss == loss_fn
    d1 = ce.backward(1.0, cache)
    d3 = ce.backward(3.0, cache)
    assert d1.shape == logits.shape
    assert np.abs(d3 - 3 * d1).max() < 1e-15, "dlogits must scale linearly with dloss"


def test_bad_targets_and_options_raise():
    logits = np.zeros((3, 5))
    with pytest.raises(IndexError, match=r"\[0, 5\)"):
        softmax_cross_entropy_forward(logits, np.array([0, 5, 1]))
    with pytest.raises(ValueError, match="shape"):
        softmax_cross_entropy_forward(logits, np.array([0, 1]))
    with pytest.raises(ValueError, match="label_smoothing"):
        CrossEntropyLoss(label_smoothing=1.5)
