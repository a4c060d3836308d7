"""The Llama's trace and memory against the formulas: one real training step per TP × DP layout, every row exact.

As tests/mpi/test_traced_formulas.py does for the GPT: this rank's records of one step (batch broadcast, forward,
backward with the ``kv`` sub-group's all-reduce of replicated KV heads' gradients, DDP, clipping, AdamW)
beside ``predict_step`` for a ``LlamaConfig``, with KV heads split and replicated, with and without sequence
parallelism; then the parameter, gradient, optimizer and activation bytes against ``predict_memory``.
"""

from __future__ import annotations

import pytest

from tpsim.models.llama import build_llama
from tpsim.arch.llama import LlamaConfig
from tpsim.predict.llama_memory import llama_block_activation_elements

from _util import assert_memory_matches_formulas, assert_step_matches_formulas

SEQ = 8  # the sequence splits over every tp up to 8 (2 rows a DP rank: tests/mpi/_util.py)


def config(kv: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=13, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                       num_attention_heads=8, num_key_value_heads=kv, max_position_embeddings=SEQ)


@pytest.mark.parametrize("kv, sp", [(1, False), (8, False), (1, True)], ids=["kv1", "kv8", "kv1-sp"])
def test_llama_step_matches_the_formulas(grid, kv, sp):
    cfg = config(kv)
    model = build_llama(cfg, grid.tp_group, seed=2, sequence_parallel=sp)
    assert_step_matches_formulas(grid, model, cfg, sp, SEQ, f"Llama kv {kv}, sp {sp}")


@pytest.mark.parametrize("kv, sp", [(1, False), (8, True)], ids=["kv1", "kv8-sp"])
def test_llama_memory_per_rank_matches_the_formulas(grid, kv, sp):
    cfg = config(kv)
    model = build_llama(cfg, grid.tp_group, seed=1, sequence_parallel=sp)
    block = llama_block_activation_elements(cfg, grid.tp, 3, SEQ, sp)
    assert_memory_matches_formulas(grid, model, cfg, sp, SEQ, block, f"Llama kv {kv}, sp {sp}")
