"""The tensor-parallel Nemotron vs the serial one drawn from the same seed, and its trace and memory against the
formulas.

Loss and every gradient equal the serial model's with KV heads split and replicated, under sequence parallelism
(LayerNorm1P's weight and bias gradients all-reduced as one [2, h] message), and in DP × TP training with
clipping; one real step's collectives against ``predict_step`` row by row, and the parameter, gradient, optimizer
and activation bytes against ``predict_memory`` (``tpsim.predict.nemotron_memory``). At world 8 the ``grid``
fixture runs tp 1, 2, 4, 8 (DP fills the rest).
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.arch import architecture
from tpsim.arch.nemotron import NemotronConfig
from tpsim.models.nemotron import parallel_nemotron, serial_nemotron
from tpsim.predict.nemotron_memory import block_activation_elements

from _util import (assert_memory_matches_formulas, assert_shards_match_serial, assert_step_matches_formulas,
                   assert_training_with_clipping_matches_serial)

TOL = 1e-10
SEQ = 8


def config(tp: int, kv: int | None) -> NemotronConfig:
    heads = 2 * tp
    return NemotronConfig(vocab_size=16 * tp + 3, hidden_size=8 * heads, intermediate_size=6 * tp,
                          num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=kv or heads,
                          max_position_embeddings=16, rope_theta=100.0, initializer_range=0.3)


def data(cfg, b=3, s=SEQ, seed=1):
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.vocab_size, (b, s)), rng.integers(0, cfg.vocab_size, (b, s))


def moved_norms(model, seed=9):
    """The norms' stored weights and biases off their zeros (the same draw on every rank and the serial twin)."""
    rng = np.random.default_rng(seed)
    for name, p in model.named_parameters():
        if "layernorm" in name or name.startswith("model.norm"):
            p[...] = 0.2 * rng.standard_normal(p.shape)
    return model


def assert_matches_serial(par, serial, grads=True):
    assert_shards_match_serial(par, serial, grads, TOL)


@pytest.mark.parametrize("kv, sp", [(1, False), (2, False), (None, False), (1, True), (None, True)],
                         ids=["kv1", "kv2", "kv=heads", "kv1-sp", "kv=heads-sp"])
def test_nemotron_equals_serial(grid, kv, sp):
    cfg = config(grid.tp, kv)
    serial = moved_norms(serial_nemotron(cfg, seed=4))
    par = parallel_nemotron(moved_norms(serial_nemotron(cfg, seed=4)), grid.tp_group, sequence_parallel=sp)
    ids, labels = data(cfg)
    loss_s, loss_p = serial.loss_and_grads(ids, labels), par.loss_and_grads(ids, labels)
    assert abs(loss_p - loss_s) <= TOL * abs(loss_s), f"loss {loss_p!r} vs serial {loss_s!r}"
    assert_matches_serial(par, serial)


def test_the_registry_builds_it_and_dp_tp_training_with_clipping_equals_serial(grid):
    cfg = config(grid.tp, 1)  # replicated KV heads: the norm must count each once
    ids, labels = data(cfg, b=8, seed=6)
    par = architecture("nemotron").build(cfg, grid.tp_group, seed=3)
    assert_training_with_clipping_matches_serial(grid, serial_nemotron(cfg, seed=3), par, ids, labels, tol=TOL)


def formula_config(kv: int) -> NemotronConfig:
    return NemotronConfig(vocab_size=13, hidden_size=64, intermediate_size=40, num_hidden_layers=2,
                          num_attention_heads=8, num_key_value_heads=kv, max_position_embeddings=SEQ)


@pytest.mark.parametrize("kv, sp", [(1, False), (8, False), (1, True)], ids=["kv1", "kv8", "kv1-sp"])
def test_nemotron_step_matches_the_formulas(grid, kv, sp):
    cfg = formula_config(kv)
    model = architecture("nemotron").build(cfg, grid.tp_group, seed=2, sequence_parallel=sp)
    assert_step_matches_formulas(grid, model, cfg, sp, SEQ, f"Nemotron kv {kv}, sp {sp}")


@pytest.mark.parametrize("kv, sp", [(1, False), (8, True)], ids=["kv1", "kv8-sp"])
def test_nemotron_memory_per_rank_matches_the_formulas(grid, kv, sp):
    cfg = formula_config(kv)
    model = architecture("nemotron").build(cfg, grid.tp_group, seed=1, sequence_parallel=sp)
    block = block_activation_elements(cfg, grid.tp, 3, SEQ, sp)
    assert_memory_matches_formulas(grid, model, cfg, sp, SEQ, block, f"Nemotron kv {kv}, sp {sp}")
