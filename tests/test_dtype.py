"""A float32 model computes in float32 end to end (a NumPy float64 scalar would silently promote it)."""

import numpy as np

from tpsim.data import ReverseTask
from tpsim.models.build import serial_gpt
from tpsim.arch.gpt2 import GPTConfig


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


def _float_arrays(obj, path="cache"):
    """Every floating array inside a (nested) cache: NamedTuples, tuples, lists, dicts."""
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind == "f":
            yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _float_arrays(v, f"{path}[{k!r}]")
    elif isinstance(obj, (tuple, list)):
        names = getattr(obj, "_fields", range(len(obj)))
        for name, v in zip(names, obj):
            yield from _float_arrays(v, f"{path}.{name}")


def test_float32_step_keeps_every_activation_gradient_and_optimizer_state_float32():
    """Dropout on, one AdamW step: no cached activation, gradient or optimizer slot is float64."""
    from tpsim.nn.dropout import DropoutPlan
    from tpsim.tp.random import ExactDropoutRNG
    from tpsim.train.optim import AdamW

    cfg = GPTConfig(vocab_size=11, n_positions=8, n_embd=16, n_layer=2, n_head=4, dropout=0.1)
    model = serial_gpt(cfg, seed=0, dtype=np.float32)
    ids, labels = ReverseTask(11, 8).batch(0, 0, 3)
    _, cache = model.forward(ids, labels, DropoutPlan(ExactDropoutRNG(1), 0))
    arrays = dict(_float_arrays(cache))
    assert len(arrays) > 20, f"the walk found only {len(arrays)} arrays in the cache"
    bad = {n: a.dtype for n, a in arrays.items() if a.dtype != np.float32}
    assert not bad, f"activations promoted: {bad}"
    optimizer = AdamW(model, lr=1e-2)
    model.loss_and_grads(ids, labels, DropoutPlan(ExactDropoutRNG(1), 0))
    optimizer.step()
    state = {f"{n}.{k}": v.dtype for n, slots in optimizer.state.items() for k, v in slots.items()}
    params = {n: p.dtype for n, p in model.named_parameters()}
    bad = {n: d for n, d in {**state, **params}.items() if d != np.float32}
    assert not bad, f"promoted after the update: {bad}"


def test_gradient_buffers_are_reused_across_steps():
    """zero_grad fills in place and backward adds in place: the same memory holds every step's gradients."""
    from tpsim.train.optim import AdamW

    cfg = GPTConfig(vocab_size=11, n_positions=8, n_embd=16, n_layer=2, n_head=4)
    model = serial_gpt(cfg, seed=0, dtype=np.float32)
    optimizer = AdamW(model, lr=1e-2)
    addresses = {n: g.__array_interface__["data"][0] for n, g in model.named_grads()}
    for step in range(2):
        ids, labels = ReverseTask(11, 8).batch(0, step, 3)
        optimizer.zero_grad()
        model.loss_and_grads(ids, labels)
        optimizer.step()
    moved = [n for n, g in model.named_grads() if g.__array_interface__["data"][0] != addresses[n]]
    assert not moved, f"gradient buffers re-allocated: {moved}"
