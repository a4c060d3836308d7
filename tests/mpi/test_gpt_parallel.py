"""The tensor-parallel GPT vs the serial GPT built from the same seed: loss and every gradient.

Also: a padded vocabulary, dropout with the exact RNG, and the collectives each layer issues.
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.compare import shard_differences
from tpsim.errors import ConfigError
from tpsim.models.build import parallel_gpt, serial_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.nn.dropout import DropoutPlan
from tpsim.tp.random import ExactDropoutRNG

TOL = 1e-10


def config(tp, vocab=None, dropout=0.0):
    return GPTConfig(vocab_size=vocab or 16 * tp + 3, n_positions=9, n_embd=4 * tp * 2, n_layer=2,
                     n_head=2 * tp, dropout=dropout)


def data(cfg, b=3, s=7, seed=1):
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.vocab_size, (b, s)), rng.integers(0, cfg.vocab_size, (b, s))


def compare(serial, par, plan_s=DropoutPlan(), plan_p=DropoutPlan(), ids=None, labels=None):
    loss_s = serial.loss_and_grads(ids, labels, plan_s)
    loss_p = par.loss_and_grads(ids, labels, plan_p)
    assert abs(loss_p - loss_s) <= TOL * abs(loss_s), f"loss {loss_p!r} vs serial {loss_s!r}"
    assert_grads_match(serial, par)


def assert_grads_match(serial, par):
    """Every gradient shard of ``par`` equals the matching slice of ``serial``'s gradient (relative TOL)."""
    ref = dict(serial.named_grads())
    names = [n for n, _ in par.named_parameters()]
    assert names == list(ref), "parameter names differ from the serial model's"
    worst = shard_differences(par, ref, floor=1e-300)  # relative to each tensor's scale
    bad = {k: f"{v:.1e}" for k, v in worst.items() if v > TOL}
    assert not bad, f"gradients differ from serial (relative): {bad}"


@pytest.mark.parametrize("vocab", [None, 13], ids=["vocab16p+3", "vocab13"])
def test_gpt_equals_serial(grid, vocab):
    cfg = config(grid.tp, vocab)
    serial = serial_gpt(cfg, seed=4)
    par = parallel_gpt(serial_gpt(cfg, seed=4), grid.tp_group)
    ids, labels = data(cfg)
    compare(serial, par, ids=ids, labels=labels)


def test_gpt_with_dropout_equals_serial_under_exact_rng(grid):
    cfg = config(grid.tp, dropout=0.2)
    serial = serial_gpt(cfg, seed=5)
    par = parallel_gpt(serial_gpt(cfg, seed=5), grid.tp_group)
    ids, labels = data(cfg)
    plan = DropoutPlan(rng=ExactDropoutRNG(77), step=3)
    compare(serial, par, plan, plan, ids, labels)
    # and the dropout really did something: the loss differs from the no-dropout loss
    assert serial.forward(ids, labels, plan)[0] != serial.forward(ids, labels)[0]


def test_gpt_with_data_parallel_rows_equals_serial_rows(grid):
    """A DP rank holding rows 1..2 of the global batch draws the serial model's dropout bits for those rows."""
    cfg = config(grid.tp, dropout=0.2)
    serial = serial_gpt(cfg, seed=6)
    par = parallel_gpt(serial_gpt(cfg, seed=6), grid.tp_group)
    ids, labels = data(cfg, b=4)
    rows = np.array([1, 2])
    rng = ExactDropoutRNG(3)
    # serial on the whole batch, restricted to rows 1..2 by ignoring the others' labels
    masked = labels.copy()
    masked[[0, 3]] = -100
    loss_s = serial.loss_and_grads(ids, masked, DropoutPlan(rng, 0))
    loss_p = par.loss_and_grads(ids[rows], labels[rows], DropoutPlan(rng, 0, batch_index=rows))
    assert abs(loss_p - loss_s) <= TOL * abs(loss_s)
    assert_grads_match(serial, par)  # rows 0 and 3 carry no loss in the serial run: the gradients compare too


def test_gpt_collectives_per_layer(grid):
    cfg = config(grid.tp)
    par = parallel_gpt(serial_gpt(cfg, seed=4), grid.tp_group)
    ids, labels = data(cfg)
    par.loss_and_grads(ids, labels)
    b, s, h = ids.shape + (cfg.n_embd,)
    ev = [(e.scope, e.phase, e.op, e.reduce_op, e.shape) for e in grid.tracer.events]
    expected = [("transformer.wte", "forward", "all_reduce", "sum", (b, s, h))]
    for i in range(cfg.n_layer):
        expected += [(f"transformer.h.{i}.attn.c_proj", "forward", "all_reduce", "sum", (b, s, h)),
                     (f"transformer.h.{i}.mlp.c_proj", "forward", "all_reduce", "sum", (b, s, h))]
    expected += [("loss", "forward", "all_reduce", op, (b * s,)) for op in ("max", "sum", "sum")]
    expected += [("lm_head", "backward", "all_reduce", "sum", (b, s, h))]
    for i in reversed(range(cfg.n_layer)):
        expected += [(f"transformer.h.{i}.mlp.c_fc", "backward", "all_reduce", "sum", (b, s, h)),
                     (f"transformer.h.{i}.attn.c_attn", "backward", "all_reduce", "sum", (b, s, h))]
    assert ev == expected


def test_bad_gpt_sizes_raise_config_error_everywhere(grid):
    if grid.tp == 1:
        pytest.skip("every head count divides by 1")
    cfg = GPTConfig(vocab_size=10, n_positions=4, n_embd=3 * (grid.tp + 1), n_layer=1, n_head=grid.tp + 1)
    with pytest.raises(ConfigError, match=f"heads {grid.tp + 1} is not divisible by tp {grid.tp}"):
        parallel_gpt(serial_gpt(cfg), grid.tp_group)
    with pytest.raises(ConfigError, match="hidden size 10 is not divisible by heads 4"):
        GPTConfig(n_embd=10, n_head=4).check(grid.tp)
