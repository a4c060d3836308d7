"""Context parallelism's configuration, rank order and formulas, MPI-free.

The grid puts CP between TP and DP (Megatron's order TP, CP, DP, PP), the gradient group is DP × CP, and every
impossible layout is refused in one line naming the constraint before any work. ``cp_messages`` adds up to the
per-layer bytes of each variant stated in its docstring (ring = all-gather forward; ring backward = K/V again
plus dK/dV; Ulysses four all-to-alls a direction of (C − 1)/C of the local Q, K, V, O).
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.arch import GPTConfig, LlamaConfig
from tpsim.comm.grid import format_grid, grid_cube
from tpsim.config import Parallelism, RunConfig
from tpsim.errors import ConfigError
from tpsim.predict.cp_comm import cp_layer_bytes, cp_messages

GPT = GPTConfig(vocab_size=32, n_positions=16, n_embd=32, n_layer=2, n_head=4)
LLAMA = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)


def test_rank_order_is_tp_then_cp_then_dp_then_pp():
    cube = grid_cube(16, tp=2, dp=2, pp=2, cp=2)  # [pp, dp·cp, tp]
    assert cube.shape == (2, 4, 2)
    four = cube.reshape(2, 2, 2, 2)  # [pp, dp, cp, tp]
    for pp, dp, cp, tp in np.ndindex(2, 2, 2, 2):
        assert four[pp, dp, cp, tp] == pp * 8 + dp * 4 + cp * 2 + tp


def test_grid_text_names_cp_groups_and_dp_x_cp():
    text = format_grid(grid_cube(8, tp=2, cp=2)[0], cp=2)
    assert text.startswith("Process grid: TP(2) x CP(2) x DP(2) = 8 ranks")
    assert "CP group 0: ranks [0, 2]" in text and "CP group 3: ranks [5, 7]" in text
    assert "DP x CP group (gradients averaged) 0: ranks [0, 2, 4, 6]" in text


def test_world_and_gradient_replicas():
    par = Parallelism(tp=2, dp=3, pp=2, cp=4).check()
    assert par.world == 48 and par.grad_replicas == 12


@pytest.mark.parametrize("kwargs, words", [
    (dict(cp=2, seq_len=6), "--seq-len 6 is not divisible by 4 (zigzag over cp 2: 2 x cp = 4 chunks)"),
    (dict(cp=4, seq_len=10, cp_layout="contiguous"), "--seq-len 10 is not divisible by 4 (contiguous over cp 4"),
    (dict(cp=2, cp_comm="ulysses", tp=4, seq_len=16), "--cp-comm ulysses: 1 query and 1 KV heads per TP rank"),
    (dict(cp=2, cp_comm="rings", seq_len=16), "--cp-comm 'rings': one of ring, allgather, ulysses"),
    (dict(cp=2, cp_layout="zig", seq_len=16), "--cp-layout 'zig': one of zigzag, contiguous"),
    (dict(cp=2, tp=2, sp=True, seq_len=12), None),  # 6 tokens per CP rank split over tp 2: fine
    (dict(cp=4, tp=2, sp=True, seq_len=12, cp_layout="contiguous"),
     "--seq-len 12 / cp 4 = 3 tokens per CP rank is not divisible by tp 2"),
    (dict(cp=0, seq_len=16), "--cp must be >= 1, got 0"),
])
def test_impossible_layouts_are_one_line(kwargs, words):
    model = LLAMA if kwargs.get("cp_comm") == "ulysses" else GPT
    if words is None:
        RunConfig.of(model, batch_size=4, **kwargs)
        return
    with pytest.raises(ConfigError) as err:
        RunConfig.of(model, batch_size=4, **kwargs)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_llama_ulysses_needs_kv_heads_divisible_by_cp():
    with pytest.raises(ConfigError, match="4 query and 2 KV heads per TP rank must both divide by cp 4"):
        RunConfig.of(LLAMA, cp=4, cp_comm="ulysses", seq_len=16, batch_size=4)
    RunConfig.of(LLAMA, cp=2, cp_comm="ulysses", seq_len=16, batch_size=4)


SIZES = dict(b=2, s=32, heads=8, kv_heads=2, head_dim=4, e=2)


def test_ring_forward_is_the_all_gather_and_backward_adds_dkv():
    kv = 2 * 2 * (32 // 4) * 4 * 2  # one K or V shard, bytes
    ring, gather = cp_layer_bytes("ring", 4, **SIZES), cp_layer_bytes("allgather", 4, **SIZES)
    assert ring["forward"] == gather["forward"] == 3 * 2 * kv
    assert ring["backward"] == 3 * 2 * kv + 4 * 2 * kv and gather["backward"] == 3 * 2 * kv


def test_ulysses_moves_three_quarters_of_q_k_v_o_each_way():
    q, kv = 2 * 8 * 8 * 4 * 2, 2 * 2 * 8 * 4 * 2
    u = cp_layer_bytes("ulysses", 4, **SIZES)
    assert u["forward"] == u["backward"] == 3 * (2 * q + 2 * kv) // 4
    assert [op for _, op, _, _ in cp_messages("ulysses", 4, **SIZES)] == ["all_to_all"] * 8


def test_only_kv_heads_travel_and_cp1_sends_nothing():
    mha = cp_layer_bytes("ring", 4, **{**SIZES, "kv_heads": 8})
    assert mha["forward"] == 4 * cp_layer_bytes("ring", 4, **SIZES)["forward"]
    assert cp_messages("ring", 1, **SIZES) == []
