"""Serial causal self-attention: backward vs finite differences (with and without dropout), causality, a plain
per-head reference forward, no NaN at large scores, and a clear error when hidden does not split into heads."""

import numpy as np
import pytest

from tpsim.nn import CausalSelfAttention, DropoutPlan, check_module_grads
from tpsim.tp.random import ExactDropoutRNG

TOL = 1e-7  # float64 central differences with eps 1e-6 land near 1e-9; 1e-7 leaves honest headroom
B, S, H, HEADS = 2, 5, 12, 3
PATH = "transformer.h.0.attn"


def make_attention(seed=0, std=0.5, attn_dropout=0.0):
    """Weights large enough that the softmax is far from uniform, and non-zero biases so they are exercised."""
    rng = np.random.default_rng(seed)
    attn = CausalSelfAttention(H, HEADS, rng=rng, std=std, attn_dropout=attn_dropout).set_path(PATH)
    attn.c_attn.params["bias"][:] = rng.standard_normal(3 * H) * 0.3
    attn.c_proj.params["bias"][:] = rng.standard_normal(H) * 0.3
    return attn


def reference_attention(attn, x, keep=None, p=0.0):
    """The textbook formula, one batch row and one head at a time, sharing nothing with the layer's code."""
    w, bias = attn.c_attn.params["weight"], attn.c_attn.params["bias"]
    hd = H // HEADS
    out = np.zeros((x.shape[0], x.shape[1], H))
    for b in range(x.shape[0]):
        for j in range(HEADS):
            cols = [slice(part * H + j * hd, part * H + (j + 1) * hd) for part in range(3)]
            q, k, v = (x[b] @ w[:, c] + bias[c] for c in cols)
            scores = q @ k.T / np.sqrt(hd)
            for i in range(x.shape[1]):
                scores[i, i + 1:] = -np.inf  # query i may not look at keys after it
            probs = np.exp(scores - scores.max(axis=1, keepdims=True))
            probs /= probs.sum(axis=1, keepdims=True)
            if keep is not None:
                probs = probs * keep[b, j] / (1.0 - p)
            out[b, :, j * hd:(j + 1) * hd] = probs @ v
    return out @ attn.c_proj.params["weight"] + attn.c_proj.params["bias"]


def test_attention_grads_match_finite_differences():
    attn = make_attention()
    x = np.random.default_rng(1).standard_normal((B, S, H))
    errors = check_module_grads(attn, x)
    assert set(errors) == {"input", "c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias"}
    for name, err in errors.items():
        assert err < TOL, f"{name}: max relative error {err:.3e} vs finite differences"


def test_attention_grads_with_dropout_match_finite_differences():
    """The exact tracker is a pure function of (seed, key, step, position): the same mask at every FD probe."""
    attn = make_attention(attn_dropout=0.3)
    x = np.random.default_rng(2).standard_normal((B, S, H))
    rng = ExactDropoutRNG(seed=7)
    keep = rng.keep_mask(0.3, PATH + ".attn_dropout", 4, (B, HEADS, S, S), (slice(None),) * 4, "partitioned")
    assert 0 < keep.sum() < keep.size, "the mask should drop some probabilities and keep others"
    errors = check_module_grads(attn, x, forward_kwargs={"plan": DropoutPlan(rng, step=4)})
    for name, err in errors.items():
        assert err < TOL, f"{name} (dropout p=0.3): max relative error {err:.3e} vs finite differences"


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_attention_forward_matches_plain_reference(p):
    attn = make_attention(seed=3, attn_dropout=p)
    x = np.random.default_rng(4).standard_normal((B, S, H))
    rng = ExactDropoutRNG(seed=11)
    y, _ = attn.forward(x, DropoutPlan(rng, step=2))
    keep = rng.keep_mask(p, PATH + ".attn_dropout", 2, (B, HEADS, S, S), (slice(None),) * 4, "partitioned")
    ref = reference_attention(attn, x, keep if p > 0 else None, p)
    assert y.shape == (B, S, H)
    assert np.abs(y - ref).max() < 1e-12, f"max diff vs per-head reference {np.abs(y - ref).max():.3e}"


def test_attention_without_rng_or_p_is_deterministic_and_dropout_changes_output():
    x = np.random.default_rng(5).standard_normal((B, S, H))
    plain = make_attention(seed=6)
    dropping = make_attention(seed=6, attn_dropout=0.3)
    y0, _ = plain.forward(x, DropoutPlan(ExactDropoutRNG(1)))  # p = 0: the tracker is never asked
    y1, _ = dropping.forward(x)  # no tracker: evaluation, no dropout
    assert np.array_equal(y0, y1)
    y2, _ = dropping.forward(x, DropoutPlan(ExactDropoutRNG(1)))
    assert not np.allclose(y1, y2), "attention dropout with a tracker should change the output"


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_attention_is_causal(p):
    """Changing tokens t+1.. must leave outputs 0..t untouched, with dropout too (its mask is position-fixed)."""
    attn = make_attention(seed=7, attn_dropout=p)
    x = np.random.default_rng(8).standard_normal((B, S, H))
    for t in range(S - 1):
        x2 = x.copy()
        x2[:, t + 1:] += np.random.default_rng(t).standard_normal((B, S - t - 1, H))
        y, _ = attn.forward(x, DropoutPlan(ExactDropoutRNG(3)))
        y2, _ = attn.forward(x2, DropoutPlan(ExactDropoutRNG(3)))
        assert np.array_equal(y[:, :t + 1], y2[:, :t + 1]), f"output at positions <= {t} saw a future token"
        assert not np.allclose(y[:, t + 1:], y2[:, t + 1:]), "later positions should see the change"


def test_attention_large_scores_give_no_nan_and_no_grad_to_the_future():
    attn = make_attention(seed=9, std=30.0)  # scores in the thousands: the softmax max-trick must hold
    x = np.random.default_rng(10).standard_normal((B, S, H))
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # underflow to 0 is the point
        y, cache = attn.forward(x)
        dx = attn.backward(np.ones_like(y), cache)
    assert np.isfinite(y).all() and np.isfinite(dx).all()
    probs = cache.core.attention.softmax.y  # the serial core's probabilities, before dropout
    assert np.array_equal(np.triu(probs, k=1), np.zeros_like(probs)), "future keys must get zero weight"
    assert np.allclose(probs.sum(axis=-1), 1.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("hidden, heads", [(12, 5), (10, 4), (7, 0)])
def test_attention_rejects_hidden_not_divisible_by_heads(hidden, heads):
    with pytest.raises(ValueError, match=f"hidden = {hidden} must be divisible by heads = {heads}"):
        CausalSelfAttention(hidden, heads)


def test_attention_rejects_bad_dropout():
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        CausalSelfAttention(12, 3, attn_dropout=1.0)


def test_attention_batch_index_gives_the_serial_rows_dropout_bits():
    """A rank holding some batch rows (data parallelism) draws the bits the full batch has for those rows."""
    attn = make_attention(seed=12, attn_dropout=0.3)
    x = np.random.default_rng(13).standard_normal((5, S, H))
    rows = np.array([1, 4])
    y_full, _ = attn.forward(x, DropoutPlan(ExactDropoutRNG(2), step=1))
    y_rows, _ = attn.forward(x[rows], DropoutPlan(ExactDropoutRNG(2), step=1, batch_index=rows))
    y_first, _ = attn.forward(x[rows], DropoutPlan(ExactDropoutRNG(2), step=1))  # rows taken as 0, 1: other bits
    assert np.abs(y_rows - y_full[rows]).max() < 1e-12
    assert not np.allclose(y_first, y_full[rows])
    with pytest.raises(ValueError, match="batch_index"):
        attn.forward(x, DropoutPlan(ExactDropoutRNG(2), batch_index=rows))
