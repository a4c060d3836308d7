"""Vocabulary parallelism vs its serial twins: embedding, tied LM head, and the vocab-parallel cross-entropy.

Story: draw the serial layer (or the full logits), shard by vocabulary with padding, run both on the same
input and upstream gradient, and compare every output and gradient with the matching slice of the serial
one. Vocabulary sizes are awkward on purpose (13, 16·p + 3), so some ranks hold padded rows — at tp = 8 and
V = 13 the last rank holds nothing but padding — and the padding must never show in a loss or a gradient.
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.nn import Embedding, Module, softmax_cross_entropy_backward, softmax_cross_entropy_forward
from tpsim.tp import (ParallelLMHead, VocabParallelCrossEntropy, VocabParallelEmbedding, padded_vocab_size,
                      vocab_parallel_cross_entropy_forward, vocab_range)
from _util import assert_close, randn

TOL = 1e-12
SHAPE = (2, 7)  # 14 tokens
N_TOKENS = 14
DIM = 5
VOCABS = {"V13": lambda p: 13, "V11p": lambda p: 11 * p, "V16p+3": lambda p: 16 * p + 3}


def rows_of(layer, vocab: int) -> tuple[slice, int]:
    """The serial rows this rank's shard mirrors, and how many of its rows are real (the rest is padding)."""
    n_real = max(0, min(layer.vocab_end, vocab) - layer.vocab_start)
    return slice(layer.vocab_start, layer.vocab_start + n_real), n_real


def token_ids(seed: int, vocab: int) -> np.ndarray:
    """[2, 7] ids with repeats and both ends of the vocabulary."""
    ids = np.random.default_rng(seed).integers(0, vocab, size=SHAPE)
    ids[0, :3] = [0, vocab - 1, 0]
    ids[1, -2:] = vocab - 1
    return ids


@pytest.mark.parametrize("p", [1, 2, 3, 8])
def test_padded_vocab_and_ranges(p):
    for vocab in (1, 13, 11 * p, 16 * p + 3):
        vp = padded_vocab_size(vocab, p)
        assert vp % p == 0 and vocab <= vp < vocab + p, (vocab, p, vp)
        ranges = [vocab_range(vp, p, r) for r in range(p)]
        assert ranges == [(r * vp // p, (r + 1) * vp // p) for r in range(p)], ranges  # contiguous, equal
    assert padded_vocab_size(50257, 8, divisible_by=128) == 50176 + 1024  # Megatron's GPT-2 padding at tp 8


# --- embedding --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("vocab_name", VOCABS)
def test_embedding_equals_serial(grid, vocab_name):
    vocab = VOCABS[vocab_name](grid.tp)
    serial = Embedding(vocab, DIM, rng=np.random.default_rng(3), std=0.5)
    layer = VocabParallelEmbedding.from_serial(serial, grid.tp_group).set_path("wte")
    assert layer.padded_vocab_size == padded_vocab_size(vocab, grid.tp)
    rows, n_real = rows_of(layer, vocab)
    ids, dout = token_ids(1, vocab), randn(2, *SHAPE, DIM)

    y_ref, c_ref = serial.forward(ids)
    serial.backward(dout, c_ref)
    y, cache = layer.forward(ids)
    n_forward = len(grid.tracer.events)
    assert layer.backward(dout, cache) is None

    assert_close(y, y_ref, TOL, "embedding output")
    grad = layer.grads["weight"]
    assert_close(grad[:n_real], serial.grads["weight"][rows], TOL, "weight grad shard (repeated ids)")
    assert np.all(grad[n_real:] == 0), f"padded rows got a gradient: max {np.abs(grad[n_real:]).max()}"
    assert np.all(layer.params["weight"][n_real:] == 0), "padded rows of the weight must be zero"
    events = [(e.op, e.reduce_op, e.phase, e.scope, e.shape) for e in grid.tracer.events]
    assert events == [("all_reduce", "sum", "forward", "wte", (*SHAPE, DIM))], events
    assert len(grid.tracer.events) == n_forward, "the embedding backward must not communicate"


def test_embedding_master_init_is_tp_invariant(grid):
    vocab = 16 * grid.tp + 3
    layer = VocabParallelEmbedding(vocab, DIM, grid.tp_group, rng=np.random.default_rng(5))
    master = Embedding(vocab, DIM, rng=np.random.default_rng(5)).params["weight"]
    rows, n_real = rows_of(layer, vocab)
    assert_close(layer.params["weight"][:n_real], master[rows], 0, "embedding shard")
    part = layer.partition["weight"]
    assert part.dim == 0 and part.full == layer.padded_vocab_size
    assert np.array_equal(part.index, np.arange(layer.vocab_start, layer.vocab_end))


def test_embedding_out_of_range_ids_raise_on_every_rank(grid):
    layer = VocabParallelEmbedding(13, DIM, grid.tp_group)
    padded_ids = list(range(13, layer.padded_vocab_size))  # a padded id is out of range too
    for bad in [13, -1] + padded_ids[-1:]:
        ids = token_ids(2, 13)
        ids[1, 3] = bad
        with pytest.raises(IndexError, match=r"ids must be in \[0, 13\)"):
            layer.forward(ids)
    assert grid.tracer.events == [], "raised before any collective, so no rank is left waiting"


# --- tied LM head -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("vocab_name", ["V13", "V16p+3"])
def test_tied_lm_head_equals_serial(grid, vocab_name):
    vocab = VOCABS[vocab_name](grid.tp)
    serial = Embedding(vocab, DIM, rng=np.random.default_rng(4), std=0.5)
    w = serial.params["weight"]  # [V, dim]
    emb = VocabParallelEmbedding.from_serial(serial, grid.tp_group)
    head = ParallelLMHead(emb).set_path("lm_head")
    rows, n_real = rows_of(emb, vocab)
    h, dlogits = randn(1, *SHAPE, DIM), randn(2, *SHAPE, vocab)
    dlogits_local = np.zeros((*SHAPE, emb.vocab_end - emb.vocab_start))
    dlogits_local[..., :n_real] = dlogits[..., rows]  # padded columns: what the loss sends them, 0

    logits, cache = head.forward(h)
    dh = head.backward(dlogits_local, cache)

    assert logits.shape == (*SHAPE, emb.padded_vocab_size // grid.tp)
    assert_close(logits[..., :n_real], (h @ w.T)[..., rows], TOL, "logits (this rank's columns)")
    assert np.all(logits[..., n_real:] == 0), "padded columns come from zero rows"
    assert_close(dh, dlogits @ w, TOL, "dh")
    dw_ref = dlogits.reshape(-1, vocab).T @ h.reshape(-1, DIM)
    assert_close(emb.grads["weight"][:n_real], dw_ref[rows], TOL, "head grad, seen through the embedding")
    # tied = one weight array and one gradient array, listed once
    assert head.params["weight"] is emb.params["weight"] and head.grads["weight"] is emb.grads["weight"]
    model = Module()
    model.wte, model.lm_head = emb, head
    assert [name for name, _ in model.named_parameters()] == ["wte.weight"]
    events = [(e.op, e.phase, e.scope, e.shape) for e in grid.tracer.events]
    assert events == [("all_reduce", "backward", "lm_head", (*SHAPE, DIM))], events


def test_untied_lm_head_has_its_own_arrays(grid):
    emb = VocabParallelEmbedding(13, DIM, grid.tp_group)
    head = ParallelLMHead(emb, tied=False)
    assert head.params["weight"] is not emb.params["weight"]
    assert np.array_equal(head.params["weight"], emb.params["weight"])
    logits, cache = head.forward(randn(1, *SHAPE, DIM))
    head.backward(np.ones_like(logits), cache)
    assert np.any(head.grads["weight"] != 0) and np.all(emb.grads["weight"] == 0)


# --- vocab-parallel cross-entropy -------------------------------------------------------------------------------
CASES = {  # name: (logit scale, label smoothing, ignored positions)
    "plain": (1.0, 0.0, []),
    "ignore": (1.0, 0.0, [(0, 1), (1, 0), (1, 6)]),
    "smoothing": (1.0, 0.1, []),
    "x1000": (1000.0, 0.0, []),
    "all-together": (1000.0, 0.1, [(0, 0), (1, 4)]),
    "all-ignored": (1.0, 0.1, [(i, j) for i in range(2) for j in range(7)]),
}


def sharded_logits(grid, vocab: int, scale: float, seed: int = 11):
    """Full logits [2, 7, V] and this rank's [2, 7, Vp/p] slice, padded columns filled with a huge 1e4."""
    full = scale * randn(seed, *SHAPE, vocab)
    vp = padded_vocab_size(vocab, grid.tp)
    start, end = vocab_range(vp, grid.tp, grid.tp_rank)
    padded = np.full((*SHAPE, vp), 1e4)  # would dominate the softmax if the padding leaked into it
    padded[..., :vocab] = full
    return full, padded[..., start:end].copy(), start, min(max(vocab - start, 0), end - start)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("vocab_name", ["V13", "V16p+3"])
def test_cross_entropy_equals_serial(grid, vocab_name, case):
    vocab = VOCABS[vocab_name](grid.tp)
    scale, eps, ignored = CASES[case]
    full, local, start, n_real = sharded_logits(grid, vocab, scale)
    targets = token_ids(12, vocab)
    for pos in ignored:
        targets[pos] = -100
    loss_fn = VocabParallelCrossEntropy(grid.tp_group, vocab_size=vocab, vocab_start=start, label_smoothing=eps)

    loss_ref, c_ref = softmax_cross_entropy_forward(full, targets, label_smoothing=eps)
    dz_ref = softmax_cross_entropy_backward(1.0, c_ref)
    loss, cache = loss_fn.forward(local, targets)
    dz = loss_fn.backward(1.0, cache)

    assert np.isfinite(loss) and np.all(np.isfinite(dz)), "NaN or inf"
    assert_close(loss, loss_ref, TOL, f"loss ({case}, V={vocab})")
    assert_close(dz[..., :n_real], dz_ref[..., start:start + n_real], TOL, f"dlogits slice ({case}, V={vocab})")
    assert np.all(dz[..., n_real:] == 0), "padded columns must get exactly zero gradient"
    if len(ignored) == N_TOKENS:
        assert loss == 0.0 and np.all(dz == 0), "all targets ignored: loss 0 and zero grads"
    elif ignored:
        rows = tuple(np.array(ignored).T)
        assert np.all(dz[rows] == 0), "ignored rows must get zero gradient"


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_cross_entropy_communication(grid, eps):
    """Three all-reduces of [tokens] numbers forward (the smoothing sum rides along as [2, tokens]), none back."""
    vocab = 16 * grid.tp + 3
    _, local, start, _ = sharded_logits(grid, vocab, 1.0)
    loss_fn = VocabParallelCrossEntropy(grid.tp_group, vocab_size=vocab, vocab_start=start,
                                        label_smoothing=eps).set_path("loss")
    loss, cache = loss_fn.forward(local, token_ids(12, vocab))
    n_forward = len(grid.tracer.events)
    loss_fn.backward(1.0, cache)

    events = [(e.op, e.reduce_op, e.phase, e.scope, e.group, e.shape, e.bytes) for e in grid.tracer.events]
    last = (2, N_TOKENS) if eps else (N_TOKENS,)
    assert events == [("all_reduce", "max", "forward", "loss", "tp", (N_TOKENS,), N_TOKENS * 8),
                      ("all_reduce", "sum", "forward", "loss", "tp", (N_TOKENS,), N_TOKENS * 8),
                      ("all_reduce", "sum", "forward", "loss", "tp", last, int(np.prod(last)) * 8)], events
    assert len(grid.tracer.events) == n_forward, "the cross-entropy backward must not communicate"


def test_label_smoothing_mean_is_global_not_per_shard(grid):
    """Megatron-LM averages log p over the local shard (``log_probs.mean(dim=-1)`` on [tokens, V/p]).

    That value is shown here with our ε convention (Megatron also rescales ε by K/(K−1), K the *shard* size):
    it equals the serial loss at tp = 1 and differs from it — on every rank differently — at tp > 1.
    """
    vocab, eps = 11 * grid.tp, 0.1  # divisible: every rank has real columns for a local mean
    full, local, start, n_real = sharded_logits(grid, vocab, 1.0)
    targets = token_ids(12, vocab)
    loss_ref, _ = softmax_cross_entropy_forward(full, targets, label_smoothing=eps)
    loss, _ = vocab_parallel_cross_entropy_forward(local, targets, grid.tp_group, vocab_size=vocab,
                                                   vocab_start=start, label_smoothing=eps)

    z = full - full.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))  # [2, 7, V]
    nll = -np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    local_mean = logp[..., start:start + n_real].mean(axis=-1)  # the bug: mean over V/p columns, not V
    megatron_style = float(((1 - eps) * nll - eps * local_mean).mean())

    assert_close(loss, loss_ref, TOL, "ours vs serial")
    if grid.tp == 1:
        assert_close(megatron_style, loss_ref, TOL, "local mean at tp=1 is the global mean")
    else:
        diff = abs(megatron_style - loss_ref)
        assert diff > 1e-6, f"the per-shard mean should differ from serial at tp={grid.tp}, diff {diff:.3e}"


def test_invalid_targets_raise_on_every_rank(grid):
    vocab = 13
    _, local, start, _ = sharded_logits(grid, vocab, 1.0)
    padded_ids = list(range(vocab, padded_vocab_size(vocab, grid.tp)))
    for bad in [vocab, -1] + padded_ids[-1:]:
        targets = token_ids(12, vocab)
        targets[0, 5] = bad
        with pytest.raises(IndexError, match=r"targets must be in \[0, 13\)"):
            vocab_parallel_cross_entropy_forward(local, targets, grid.tp_group, vocab_size=vocab, vocab_start=start)
    assert grid.tracer.events == [], "raised before any collective, so no rank is left waiting"


# --- end to end: embedding -> tied head -> loss -----------------------------------------------------------------
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_embedding_head_loss_end_to_end(grid, eps):
    """wte(ids) -> h -> h·Wᵀ -> CE, with W shared: the embedding grad gets the lookup and the head parts."""
    vocab = 16 * grid.tp + 3
    serial = Embedding(vocab, DIM, rng=np.random.default_rng(9), std=0.5)
    w = serial.params["weight"]
    ids, targets = token_ids(21, vocab), token_ids(22, vocab)
    targets[1, 2] = -100

    # serial chain, backward written out by hand
    h_ref, c_emb = serial.forward(ids)
    loss_ref, c_ce = softmax_cross_entropy_forward(h_ref @ w.T, targets, label_smoothing=eps)
    dlogits = softmax_cross_entropy_backward(1.0, c_ce)
    serial.backward(dlogits @ w, c_emb)  # lookup part
    dw_ref = serial.grads["weight"] + dlogits.reshape(-1, vocab).T @ h_ref.reshape(-1, DIM)  # + head part

    # the parallel chain
    wte = VocabParallelEmbedding.from_serial(serial, grid.tp_group).set_path("wte")
    head = ParallelLMHead(wte).set_path("lm_head")
    loss_fn = VocabParallelCrossEntropy(grid.tp_group, vocab_size=vocab, vocab_start=wte.vocab_start,
                                        label_smoothing=eps).set_path("loss")
    h, c1 = wte.forward(ids)
    logits, c2 = head.forward(h)
    loss, c3 = loss_fn.forward(logits, targets)
    wte.backward(head.backward(loss_fn.backward(1.0, c3), c2), c1)

    rows, n_real = rows_of(wte, vocab)
    assert_close(loss, loss_ref, TOL, "loss")
    assert_close(wte.grads["weight"][:n_real], dw_ref[rows], TOL, "tied weight grad (lookup + head)")
    assert np.all(wte.grads["weight"][n_real:] == 0), "padded rows get no gradient"
    scopes = [(e.phase, e.scope) for e in grid.tracer.events]
    assert scopes == [("forward", "wte")] + [("forward", "loss")] * 3 + [("backward", "lm_head")], scopes
