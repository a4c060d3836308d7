"""The serial GPT: backward vs central finite differences (float64), names and shapes as GPT-2's."""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.models.build import serial_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.nn.dropout import DropoutPlan
from tpsim.tp.random import ExactDropoutRNG

CFG = GPTConfig(vocab_size=11, n_positions=7, n_embd=8, n_layer=2, n_head=2)


def batch(seed=0, b=2, s=5, vocab=11):
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab, (b, s)), rng.integers(0, vocab, (b, s))


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_gpt_backward_matches_finite_differences(dropout):
    cfg = GPTConfig(**{**CFG.as_dict(), "dropout": dropout})
    model = serial_gpt(cfg, seed=3)
    for _, w in model.named_parameters():  # move LayerNorm/bias params off their trivial init values
        w += 0.1 * np.random.default_rng(w.size).standard_normal(w.shape)
    ids, labels = batch()
    plan = DropoutPlan(rng=ExactDropoutRNG(5) if dropout else None, step=1)
    model.loss_and_grads(ids, labels, plan)
    grads = {n: g.copy() for n, g in model.named_grads()}
    rng = np.random.default_rng(0)
    worst = {}
    for name, w in model.named_parameters():
        flat = w.reshape(-1)
        picks = rng.choice(flat.size, size=min(flat.size, 6), replace=False)
        errs = []
        for i in picks:  # central differences on a few elements of every tensor
            old = flat[i]
            flat[i] = old + 1e-6
            up = model.forward(ids, labels, plan)[0]
            flat[i] = old - 1e-6
            down = model.forward(ids, labels, plan)[0]
            flat[i] = old
            num, ana = (up - down) / 2e-6, grads[name].reshape(-1)[i]
            errs.append(abs(num - ana) / max(1e-3, abs(num), abs(ana)))
        worst[name] = max(errs)
    bad = {k: v for k, v in worst.items() if v > 1e-6}
    assert not bad, f"analytic vs numerical gradient mismatch: {bad}"


def test_parameter_names_and_shapes_are_gpt2s():
    model = serial_gpt(CFG)
    shapes = {n: w.shape for n, w in model.named_parameters()}
    assert shapes == CFG.param_shapes()
    assert list(shapes)[:2] == ["transformer.wte.weight", "transformer.wpe.weight"]
    assert model.transformer.h[1].attn.c_attn.path == "transformer.h.1.attn.c_attn"


def test_same_seed_same_model_and_loss():
    ids, labels = batch()
    a, b = serial_gpt(CFG, seed=9), serial_gpt(CFG, seed=9)
    assert a.forward(ids, labels)[0] == b.forward(ids, labels)[0]
    loss = a.forward(ids, labels)[0]
    assert abs(loss - np.log(CFG.vocab_size)) < 0.1, "a fresh model predicts nearly uniformly"


def test_sequence_longer_than_positions_is_an_error():
    ids = np.zeros((1, CFG.n_positions + 1), dtype=np.int64)
    with pytest.raises(ValueError, match="exceeds n_positions"):
        serial_gpt(CFG).forward(ids, ids)
