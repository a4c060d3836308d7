"""The tensor-parallel Llama vs the serial Llama drawn from the same seed: loss and every gradient.

KV heads split (kv_heads % tp == 0) and replicated (tp > kv_heads, the ``kv`` sub-group's gradient
all-reduce), with sequence parallelism, under DP × TP training with clipping, and the fused gate/up trap.
At world 8 the ``grid`` fixture runs tp 1, 2, 4, 8 (DP fills the rest).
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.errors import ConfigError
from tpsim.models.llama import build_llama, parallel_llama, serial_llama
from tpsim.arch.llama import LlamaConfig
from tpsim.nn.swiglu import SwiGLU
from tpsim.tp.column_parallel import ColumnParallelLinear
from tpsim.tp.gqa_attention import kv_head_layout
from tpsim.tp.multi_output_column_parallel import MultiOutputColumnParallelLinear
from tpsim.tp.swiglu import ParallelSwiGLU, gate_up_columns

from _util import assert_shards_match_serial, assert_training_with_clipping_matches_serial

TOL = 1e-10


def config(tp: int, kv: int | None) -> LlamaConfig:
    heads = 2 * tp
    return LlamaConfig(vocab_size=16 * tp + 3, hidden_size=4 * heads, intermediate_size=6 * tp, num_hidden_layers=2,
                       num_attention_heads=heads, num_key_value_heads=kv or heads, max_position_embeddings=16,
                       rope_theta=100.0, initializer_range=0.3)  # a large init: the attention is far from uniform


def data(cfg, b=3, s=8, seed=1):
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.vocab_size, (b, s)), rng.integers(0, cfg.vocab_size, (b, s))


def assert_matches_serial(par, serial, grads=True):
    assert_shards_match_serial(par, serial, grads, TOL)


@pytest.mark.parametrize("kv, sp", [(1, False), (2, False), (None, False), (1, True)],
                         ids=["kv1", "kv2", "kv=heads", "kv1-sp"])
def test_llama_equals_serial(grid, kv, sp):
    """KV heads replicated (kv1; kv2 at tp 4, 8), split (kv2 at tp 1, 2; kv=heads), and under SP."""
    cfg = config(grid.tp, kv)
    serial = serial_llama(cfg, seed=4)
    par = parallel_llama(serial_llama(cfg, seed=4), grid.tp_group, sequence_parallel=sp)
    ids, labels = data(cfg)
    loss_s, loss_p = serial.loss_and_grads(ids, labels), par.loss_and_grads(ids, labels)
    assert abs(loss_p - loss_s) <= TOL * abs(loss_s), f"loss {loss_p!r} vs serial {loss_s!r}"
    assert_matches_serial(par, serial)


def test_replicated_kv_heads_reduce_their_gradients_in_a_kv_subgroup(grid):
    cfg = config(grid.tp, 1)  # one KV head: replicated on every TP rank
    par = parallel_llama(serial_llama(cfg, seed=5), grid.tp_group)
    ids, labels = data(cfg)
    par.loss_and_grads(ids, labels)
    kv_events = [e for e in grid.tracer.events if e.group == "kv"]
    if grid.tp == 1:
        assert not kv_events, "tp 1 holds every KV head: nothing to reduce"
        return
    h, hd = cfg.hidden_size, cfg.head_dim
    got = [(e.scope, e.phase, e.op, e.shape, e.group_size) for e in kv_events]
    assert got == [(f"model.layers.{i}.self_attn", "backward", "all_reduce", (2, h, hd), grid.tp)
                   for i in reversed(range(cfg.num_hidden_layers))]
    attn = par.model.layers[0].self_attn
    assert attn.k_proj.partition["weight"].replica == grid.tp_group.rank  # copy numbers: only copy 0 counts


def test_kv_head_layout_maps_heads_to_ranks():
    assert [kv_head_layout(8, 2, 4, r)[0].tolist() for r in range(4)] == [[0], [0], [1], [1]]
    assert kv_head_layout(8, 2, 4, 3)[1] == 2
    assert [kv_head_layout(8, 4, 2, r)[0].tolist() for r in range(2)] == [[0, 1], [2, 3]]


@pytest.mark.parametrize("heads,kv_heads,tp,rank,message", [
    (12, 6, 4, 0, "kv_heads = 6 and tp = 4: neither divides the other"),  # was a ZeroDivisionError
    (12, 3, 4, 3, "kv_heads = 3 and tp = 4: neither divides the other"),  # was KV head 3 of 0..2
    (8, 3, 4, 0, "heads = 8 is not a multiple of kv_heads = 3"),
    (6, 2, 4, 0, "heads = 6 is not divisible by tp = 4"),
    (8, 0, 4, 0, "must be >= 1, got 8, 0, 4"),
    (8, 2, 4, 4, "tp_rank = 4 is not a rank of a TP group of 4"),
    (8, 2, 4, -1, "tp_rank = -1 is not a rank of a TP group of 4"),
])
def test_kv_head_layout_refuses_what_tpsim_refuses_in_words(heads, kv_heads, tp, rank, message):
    with pytest.raises(ConfigError, match=message):
        kv_head_layout(heads, kv_heads, tp, rank)


def test_kv_head_layout_heads_exist_and_cover_every_query_head():
    for heads, kv, tp in [(8, 8, 4), (8, 2, 4), (8, 1, 8), (16, 4, 2), (12, 6, 3), (6, 2, 6)]:
        held = [kv_head_layout(heads, kv, tp, r) for r in range(tp)]
        per = heads // tp
        for r, (index, rep) in enumerate(held):
            read = sorted({j // (heads // kv) for j in range(r * per, (r + 1) * per)})  # what its q heads read
            assert index.tolist() == read, (heads, kv, tp, r)
            assert rep == sum(other.tolist() == index.tolist() for other, _ in held)


def test_dp_tp_training_with_clipping_equals_serial(grid):
    cfg = config(grid.tp, 1)  # replicated KV heads: the norm must count each once
    ids, labels = data(cfg, b=8, seed=6)
    par = build_llama(cfg, grid.tp_group, seed=3)
    assert_training_with_clipping_matches_serial(grid, serial_llama(cfg, seed=3), par, ids, labels, tol=TOL)


def test_fused_gate_up_split_contiguously_is_wrong(grid):
    """The trap: a fused [gate | up] weight cut into p contiguous blocks pairs gate columns with gate columns."""
    if grid.tp == 1:
        pytest.skip("one rank holds every column: no split, no trap")
    tp, group = grid.tp, grid.tp_group
    rng = np.random.default_rng(7)
    serial = SwiGLU(8, 4 * tp, rng=rng, std=0.5)
    x = rng.standard_normal((2, 3, 8))
    ref = serial.forward(x)[0]
    fused = np.concatenate([serial.gate_proj.params["weight"], serial.up_proj.params["weight"]], axis=1)
    ffn_local = 4 * tp // tp

    def from_fused(columns):
        gate, up = (ColumnParallelLinear(8, 8 * tp, group, gather_output=False, bias=False, weight=fused,
                                         columns=c) for c in (columns[:ffn_local], columns[ffn_local:]))
        # label them as this rank's master columns of gate and up, as a loader cutting the fused weight would
        gate.columns = up.columns = np.arange(ffn_local) + group.rank * ffn_local
        down = ParallelSwiGLU.from_serial(serial, group).down_proj
        return ParallelSwiGLU(MultiOutputColumnParallelLinear({"gate_proj": gate, "up_proj": up}), down)

    right = from_fused(gate_up_columns(4 * tp, tp, group.rank)).forward(x)[0]
    contiguous = np.arange(group.rank * 2 * ffn_local, (group.rank + 1) * 2 * ffn_local)  # 2·ffn / p columns
    wrong = from_fused(contiguous).forward(x)[0]
    assert np.abs(right - ref).max() < 1e-13
    assert np.abs(wrong - ref).max() > 1e-3, "the contiguous split of [gate | up] should be wrong"


def test_bad_llama_layouts_raise_config_error(grid):
    if grid.tp < 4:
        pytest.skip("needs tp >= 4 for a kv_heads that neither divides nor is divided by tp")
    tp = grid.tp
    with pytest.raises(ConfigError, match="neither divides the other"):
        build_llama(LlamaConfig(hidden_size=12 * tp, num_attention_heads=3 * tp, num_key_value_heads=3,
                                intermediate_size=tp), grid.tp_group)
    with pytest.raises(ConfigError, match="not divisible by tp"):
        build_llama(LlamaConfig(hidden_size=4 * (tp + 2), num_attention_heads=tp + 2, num_key_value_heads=1,
                                intermediate_size=tp), grid.tp_group)
    with pytest.raises(ConfigError, match="intermediate_size"):
        build_llama(LlamaConfig(hidden_size=4 * tp, num_attention_heads=tp, num_key_value_heads=1,
                                intermediate_size=tp + 1), grid.tp_group)
