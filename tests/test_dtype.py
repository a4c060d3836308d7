"""A float32 model computes in float32 end to end (a NumPy float64 scalar would silently promote it)."""

import numpy as np

from tpsim.data import ReverseTask
from tpsim.models.build import serial_gpt
from tpsim.models.config import GPTConfig


def test_float32_gpt_stays_float32():
    cfg = GPTConfig(vocab_size=11, n_positions=8, n_embd=16, n_layer=2, n_head=4)
    model = serial_gpt(cfg, seed=0, dtype=np.float32)
    ids, labels = ReverseTask(11, 8).batch(0, 0, 3)
    h, cache = model.transformer.forward(ids)
    assert h.dtype == np.float32
    logits, _ = model.lm_head.forward(h)
    assert logits.dtype == np.float32
    model.loss_and_grads(ids, labels)
    bad = {n: g.dtype for n, g in model.named_grads() if g.dtype != np.float32}
    assert not bad, f"gradients promoted: {bad}"
