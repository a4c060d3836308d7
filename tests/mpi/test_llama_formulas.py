"""The Llama's trace and memory against the formulas: one real training step per TP × DP layout, every row exact.

As tests/mpi/test_traced_formulas.py does for the GPT: this rank's records of one step (batch broadcast, forward,
backward with the ``kv`` sub-group's all-reduce of replicated KV heads' gradients, DDP, clipping, AdamW)
beside ``predict_step`` for a ``LlamaConfig``, with KV heads split and replicated, with and without sequence
parallelism; then the parameter, gradient, optimizer and activation bytes against ``predict_memory``.
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.models.llama import build_llama
from tpsim.arch.llama import LlamaConfig
from tpsim.config import RunConfig
from tpsim.predict.formulas import predict_step
from tpsim.trace.formula_check import compare, format_comparison
from tpsim.predict.llama_memory import llama_block_activation_elements
from tpsim.predict.memory import param_elements, predict_memory
from tpsim.trace.measure import format_memory, measure_activations, measure_memory
from tpsim.train import AdamW, GradSync, apply_update, broadcast_batch, compute_grads, dp_slice

ROWS, SEQ = 2, 8  # rows per DP rank; the sequence splits over every tp up to 8


def config(kv: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=13, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                       num_attention_heads=8, num_key_value_heads=kv, max_position_embeddings=SEQ)


@pytest.mark.parametrize("kv, sp", [(1, False), (8, False), (1, True)], ids=["kv1", "kv8", "kv1-sp"])
def test_llama_step_matches_the_formulas(grid, kv, sp):
    cfg = config(kv)
    model = build_llama(cfg, grid.tp_group, seed=2, sequence_parallel=sp)
    sync = GradSync(model, grid.dp_group, bucket_cap_bytes=8192)
    opt = AdamW(model, lr=1e-3)
    batch = ROWS * grid.dp
    rows = dp_slice(batch, grid.dp, grid.dp_rank)
    ids, labels = np.random.default_rng(7).integers(0, cfg.vocab_size, (2, batch, SEQ))
    grid.tracer.reset()
    grid.tracer.step = 0
    ids, labels = broadcast_batch(grid, ids[rows], labels[rows])
    compute_grads(model, grid, sync, ids, labels)
    apply_update(model, opt, grid, 1.0)
    run = RunConfig.of(cfg, tp=grid.tp, dp=grid.dp, sp=sp, batch_size=batch, seq_len=SEQ)
    predicted = predict_step(run, clip=True, ddp_buckets=len(sync.buckets))
    rows = compare([e.as_dict() for e in grid.tracer.events], predicted)
    table = format_comparison(rows, title=f"Llama kv {kv}, sp {sp}, TP({grid.tp}) x DP({grid.dp}) rank {grid.rank}:")
    assert all(r.match and r.measured_wire == r.predicted_wire for r in rows), table
    assert any(r.group == "kv" for r in rows) == (grid.tp > kv), table
    assert sync.total_bytes == param_elements(cfg, grid.tp) * 8


@pytest.mark.parametrize("kv, sp", [(1, False), (8, True)], ids=["kv1", "kv8-sp"])
def test_llama_memory_per_rank_matches_the_formulas(grid, kv, sp):
    cfg = config(kv)
    model = build_llama(cfg, grid.tp_group, seed=1, sequence_parallel=sp)
    GradSync(model, grid.dp_group)
    ids, labels = np.random.default_rng(3).integers(0, cfg.vocab_size, (2, 3, SEQ))
    with grid.tracer.paused():
        _, cache = model.forward(ids, labels)
    measured = measure_memory(model, AdamW(model), cache, exclude=(ids, labels))
    predicted = predict_memory(cfg, grid.tp, 3, SEQ, np.float64, tp_rank=grid.tp_rank, sequence_parallel=sp)
    table = format_memory(measured, predicted, title=f"Llama TP({grid.tp}) rank {grid.tp_rank}, kv {kv}, sp {sp}:")
    for key, value in predicted.items():
        assert getattr(measured, key) == value, f"{key}\n{table}"
    block = llama_block_activation_elements(cfg, grid.tp, 3, SEQ, sp)
    assert measure_activations(cache.transformer.h[0]) == {"activations": 8 * block, "masks": 0, "indices": 0}
