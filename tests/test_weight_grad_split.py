"""The backward split in two (zero-bubble B and W): under ``deferred_weight_grads`` a backward computes the input
gradient only, bit for bit the whole backward's, and leaves every parameter gradient untouched; running the
queue (W) then adds exactly what the whole backward adds. Every serial layer with parameters, in float64 and for
the dense ones bfloat16 too, then a whole GPT-2 (tied embedding, dropout) and Llama (RMSNorm, SwiGLU,
grouped-query attention, untied head). A W run twice raises; one never run leaves its queue full, and its
gradients at zero. The tensor-parallel layers are checked on live ranks (tests/mpi/test_pipeline_zero_bubble.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.arch import GPTConfig, LlamaConfig, architecture_of
from tpsim.nn import Embedding, LayerNorm, Linear, MultiOutputLinear
from tpsim.nn.dropout import DropoutPlan
from tpsim.nn.lm_head import LMHead, TiedLMHead
from tpsim.nn.module import deferred_weight_grads
from tpsim.nn.precision import dtype_of
from tpsim.nn.rmsnorm import RMSNorm
from tpsim.tp.random import ExactDropoutRNG


def grads_of(module) -> dict[str, np.ndarray]:
    return {name: g.copy() for name, g in module.named_grads()}


def same_bits(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def whole_then_split(module, forward, backward):
    """``forward() -> cache`` and ``backward(cache) -> dx`` run twice from zeroed gradients: once whole, once
    under a deferral. Returns (dx whole, dx of B, grads whole, grads after B, the queue)."""
    module.zero_grad()
    dx_whole = backward(forward())
    whole = grads_of(module)
    module.zero_grad()
    cache = forward()
    with deferred_weight_grads(module) as w:
        dx_b = backward(cache)
    return dx_whole, dx_b, whole, grads_of(module), w


def check_split(module, forward, backward) -> None:
    dx_whole, dx_b, whole, after_b, w = whole_then_split(module, forward, backward)
    assert whole and any(np.any(g != 0) for g in whole.values()), "the whole backward must move some gradient"
    moved = [name for name, g in after_b.items() if np.any(g != 0)]
    assert not moved, f"B added into parameter gradients {moved}: those belong to W"
    assert len(w) > 0 and not w.ran, "B must leave its weight gradients queued"
    assert same_bits(dx_b, dx_whole), "B's input gradient differs from the whole backward's"
    w.run()
    after_w = grads_of(module)
    differ = {name: float(np.max(np.abs(after_w[name].astype(np.float64) - whole[name].astype(np.float64))))
              for name in whole if not same_bits(after_w[name], whole[name])}
    assert not differ, f"after W the gradients differ from the whole backward's: {differ}"
    assert len(w) == 0 and w.ran and w.held() == []
    with pytest.raises(RuntimeError, match="W ran twice"):
        w.run()
    assert grads_of(module).keys() == whole.keys() and all(same_bits(grads_of(module)[n], whole[n]) for n in whole)


def dense(dtype):
    """(name, module, input, output-gradient shape) of every dense serial layer, at awkward sizes."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((2, 5, 13)) * 3 + 1).astype(dtype)
    return [("linear", Linear(13, 17, rng=rng, dtype=dtype, std=0.3), x, (2, 5, 17)),
            ("linear-no-bias", Linear(13, 11, bias=False, rng=rng, dtype=dtype, std=0.3), x, (2, 5, 11)),
            ("layernorm", _perturbed(LayerNorm(13, dtype=dtype), rng), x, (2, 5, 13)),
            ("rmsnorm", _perturbed(RMSNorm(13, dtype=dtype), rng), x, (2, 5, 13))]


def _perturbed(norm, rng):
    for p in norm.params.values():  # not ones and zeros: a wrong gradient must not hide behind them
        p[...] = rng.standard_normal(p.shape).astype(p.dtype)
    return norm


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
@pytest.mark.parametrize("which", range(4), ids=["linear", "linear-no-bias", "layernorm", "rmsnorm"])
def test_dense_layers_split_into_the_whole_backwards_bits(which, dtype):
    dt = dtype_of(dtype)
    _, layer, x, shape = dense(dt)[which]
    dy = np.random.default_rng(1).standard_normal(shape).astype(dt)
    check_split(layer, lambda: layer.forward(x)[1], lambda cache: layer.backward(dy, cache))


def test_multi_output_linear_splits_into_the_whole_backwards_bits():
    rng = np.random.default_rng(3)
    layer = MultiOutputLinear({"q_proj": Linear(11, 13, rng=rng, std=0.5), "k_proj": Linear(11, 5, rng=rng),
                               "v_proj": Linear(11, 7, bias=False, rng=rng)})
    x = rng.standard_normal((2, 3, 11))
    douts = [rng.standard_normal((2, 3, n)) for n in (13, 5, 7)]
    check_split(layer, lambda: layer.forward(x)[1], lambda caches: layer.backward(douts, caches))


def test_embedding_and_heads_split_into_the_whole_backwards_bits():
    """The lookup's scatter-add is all W (B returns None: ids carry no gradient); a repeated id adds both rows.
    The tied head adds into the embedding's buffer, the untied one into its own."""
    rng = np.random.default_rng(5)
    emb = Embedding(11, 7, rng=rng)
    ids = np.array([[1, 4, 4, 10], [0, 1, 9, 4]])
    dy = rng.standard_normal((2, 4, 7))
    check_split(emb, lambda: emb.forward(ids)[1], lambda cache: emb.backward(dy, cache))
    h, dlogits = rng.standard_normal((2, 4, 7)), rng.standard_normal((2, 4, 11))
    for head in (TiedLMHead(emb), LMHead(11, 7, rng=rng)):
        check_split(head, lambda: head.forward(h)[1], lambda cache: head.backward(dlogits, cache))


def test_a_linear_w_holds_its_input_and_its_output_gradient_nothing_else():
    """What B leaves for W is what the paper says W needs: x and dy (the weight is a parameter, not memory)."""
    layer = Linear(13, 17)
    x, dy = np.ones((3, 13)), np.ones((3, 17))
    _, cache = layer.forward(x)
    with deferred_weight_grads(layer) as w:
        layer.backward(dy, cache)
    assert [id(a) for a in w.held()] == [id(dy), id(x)]


def model_config(arch: str):
    if arch == "gpt2":
        return GPTConfig(vocab_size=13, n_positions=6, n_embd=12, n_layer=2, n_head=2, dropout=0.1)
    return LlamaConfig(vocab_size=13, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=6)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_whole_model_splits_into_the_whole_backwards_bits(arch):
    """Every layer of the model queues its W during one B, in the backward's order, and W adds the same bits."""
    cfg = model_config(arch)
    model = architecture_of(cfg).serial(cfg, seed=11)
    rng = np.random.default_rng(2)
    ids, labels = rng.integers(0, cfg.vocab, (3, 6)), rng.integers(0, cfg.vocab, (3, 6))
    labels[0, :2] = -100
    plan = DropoutPlan(ExactDropoutRNG(11), 0)
    check_split(model, lambda: model.forward(ids, labels, plan)[1], lambda cache: model.backward(1.0, cache))


def test_a_w_never_run_leaves_the_gradients_at_zero_and_the_queue_full():
    """Detectable: the queue says how many layers still owe their W (the pipeline executor raises on one left)."""
    cfg = model_config("llama")
    model = architecture_of(cfg).serial(cfg, seed=11)
    ids = np.zeros((1, 6), dtype=np.int64)
    model.zero_grad()
    _, cache = model.forward(ids, ids)
    with deferred_weight_grads(model) as w:
        model.backward(1.0, cache)
    params = len(list(model.named_parameters()))
    assert len(w) == params and not w.ran  # Llama: one weight a layer, no bias: one W entry per parameter
    assert all(not np.any(g) for _, g in model.named_grads())


def test_outside_the_deferral_every_layer_adds_at_once_again_and_deferrals_do_not_nest():
    layer = MultiOutputLinear({"a": Linear(3, 2), "b": Linear(3, 4)})
    x = np.ones((2, 3))
    with deferred_weight_grads(layer):
        with pytest.raises(RuntimeError, match="already inside a weight-gradient deferral"):
            with deferred_weight_grads(layer.a):
                pass
    assert all(m.deferral is None for _, m in layer.named_modules())
    layer.zero_grad()
    outs, caches = layer.forward(x)
    layer.backward([np.ones_like(y) for y in outs], caches)
    assert np.array_equal(layer.a.grads["weight"], np.full((3, 2), 2.0))
