"""Attention split by heads vs the serial layer built from the same master weights, with and without dropout;
the qkv layout trap; the communication (one all-reduce each way); configuration errors on every rank."""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.errors import ConfigError
from tpsim.nn.attention import CausalSelfAttention, qkv_attention_forward
from tpsim.nn.dropout import DropoutPlan
from tpsim.tp import ColumnParallelLinear, ParallelSelfAttention, RowParallelLinear
from tpsim.tp.random import ExactDropoutRNG, make_dropout_rng
from _util import assert_close, randn

PATH = "transformer.h.0.attn"
B, S, HD = 2, 7, 5  # awkward sizes: odd sequence, head_dim 5


def make_serial(heads: int, p: float = 0.0, seed: int = 11) -> CausalSelfAttention:
    """Master weights with a far-from-uniform softmax and non-zero biases (identical on every rank)."""
    rng = np.random.default_rng(seed)
    serial = CausalSelfAttention(heads * HD, heads, rng=rng, std=0.3, attn_dropout=p).set_path(PATH)
    serial.c_attn.params["bias"][:] = rng.standard_normal(3 * heads * HD) * 0.3
    serial.c_proj.params["bias"][:] = rng.standard_normal(heads * HD) * 0.3
    return serial


def my_columns(hidden: int, heads: int, tp: int, r: int) -> list[int]:
    """Written out plainly: the q, k and v columns of heads r·heads/tp .. (r+1)·heads/tp − 1, in that order."""
    per = heads // tp
    return [part * hidden + j * HD + c for part in range(3) for j in range(r * per, (r + 1) * per)
            for c in range(HD)]


@pytest.mark.parametrize("p", [0.0, 0.2], ids=["no_dropout", "dropout0.2"])
@pytest.mark.parametrize("heads_per_rank", [2, 3])
def test_parallel_attention_equals_serial(grid, heads_per_rank, p):
    tp, r = grid.tp, grid.tp_rank
    heads = heads_per_rank * tp
    hidden = heads * HD
    serial = make_serial(heads, p)
    attn = ParallelSelfAttention.from_serial(serial, grid.tp_group).set_path(PATH)
    assert attn.heads_per_partition == heads_per_rank
    x, dy = randn(1, B, S, hidden), randn(2, B, S, hidden)

    y_ref, c = serial.forward(x, DropoutPlan(ExactDropoutRNG(42), step=3))
    dx_ref = serial.backward(dy, c)
    y, cache = attn.forward(x, DropoutPlan(make_dropout_rng("exact", 42, r), step=3))
    dx = attn.backward(dy, cache)

    cols = my_columns(hidden, heads, tp, r)
    rows = slice(r * hidden // tp, (r + 1) * hidden // tp)  # c_proj: this rank's heads' context columns
    assert attn.c_attn.columns.tolist() == cols
    assert attn.c_attn.partition["weight"].index.tolist() == cols
    assert_close(y, y_ref, 1e-12, "output")
    assert_close(dx, dx_ref, 1e-12, "input grad")
    assert_close(attn.c_attn.grads["weight"], serial.c_attn.grads["weight"][:, cols], 1e-12, "c_attn.weight grad")
    assert_close(attn.c_attn.grads["bias"], serial.c_attn.grads["bias"][cols], 1e-12, "c_attn.bias grad")
    assert_close(attn.c_proj.grads["weight"], serial.c_proj.grads["weight"][rows], 1e-12, "c_proj.weight grad")
    assert_close(attn.c_proj.grads["bias"], serial.c_proj.grads["bias"], 1e-12, "c_proj.bias grad")


def test_parallel_attention_with_data_parallel_rows_equals_serial(grid):
    """Each DP rank holds strided batch rows; ``batch_index`` keeps its dropout bits those of the serial rows."""
    heads, hidden = 2 * grid.tp, 2 * grid.tp * HD
    batch = 2 * grid.dp
    rows = np.arange(grid.dp_rank, batch, grid.dp)
    serial = make_serial(heads, p=0.2)
    attn = ParallelSelfAttention.from_serial(serial, grid.tp_group).set_path(PATH)
    x, dy = randn(3, batch, S, hidden), randn(4, batch, S, hidden)
    y_ref, c = serial.forward(x, DropoutPlan(ExactDropoutRNG(5), step=8))
    dx_ref = serial.backward(dy, c)
    y, cache = attn.forward(x[rows], DropoutPlan(ExactDropoutRNG(5), step=8, batch_index=rows))
    dx = attn.backward(dy[rows], cache)
    assert_close(y, y_ref[rows], 1e-12, "output rows")
    assert_close(dx, dx_ref[rows], 1e-12, "input grad rows")
    with grid.tracer.paused():  # the DP sum of the shards' grads is the serial grad (the DP sync, by hand)
        dw = grid.dp_group.all_reduce(attn.c_attn.grads["weight"])
    assert_close(dw, serial.c_attn.grads["weight"][:, attn.c_attn.columns], 1e-12, "c_attn.weight grad (DP sum)")


def test_naive_contiguous_qkv_split_is_wrong(grid):
    """The qkv layout trap: a contiguous block of the 3h columns is not whole heads, and computes nonsense."""
    if grid.tp == 1:
        pytest.skip("at tp 1 the contiguous block is every column")
    tp, r = grid.tp, grid.tp_rank
    heads = 2 * tp
    hidden = heads * HD
    serial = make_serial(heads)
    naive = ColumnParallelLinear.from_serial(serial.c_attn, grid.tp_group, gather_output=False)
    block = 3 * hidden // tp
    assert naive.columns.tolist() == list(range(r * block, (r + 1) * block))
    assert set(naive.columns.tolist()) != set(my_columns(hidden, heads, tp, r))
    if tp == 2 and r == 0:  # rank 0 of 2: all of q, half of k, none of v
        assert naive.columns.tolist() == list(range(hidden + hidden // 2))
    attn = ParallelSelfAttention.from_serial(serial, grid.tp_group)
    with pytest.raises(ValueError, match="whole heads"):
        ParallelSelfAttention(naive, attn.c_proj, heads)

    x = randn(1, B, S, hidden)
    y_ref, _ = serial.forward(x)
    qkv, _ = naive.forward(x)  # what the naive shard would feed the core: q | k | v it does not really hold
    ctx, _ = qkv_attention_forward(qkv, heads // tp)
    y_naive, _ = attn.c_proj.forward(ctx)
    assert np.abs(y_naive - y_ref).max() > 1e-3, "the naive split should not reproduce serial attention"


def test_parallel_attention_communication(grid):
    """Exactly one all-reduce forward (g, in c_proj) and one backward (f, in c_attn), each [b, s, h]."""
    heads, hidden = 2 * grid.tp, 2 * grid.tp * HD
    serial = CausalSelfAttention(hidden, heads, rng=np.random.default_rng(0), attn_dropout=0.2)
    attn = ParallelSelfAttention.from_serial(serial, grid.tp_group).set_path(PATH)
    x = randn(1, B, S, hidden)
    y, cache = attn.forward(x, DropoutPlan(make_dropout_rng("megatron", 3, grid.tp_rank)))
    attn.backward(np.ones_like(y), cache)
    ev = grid.tracer.events
    assert [(e.op, e.phase, e.scope) for e in ev] == [
        ("all_reduce", "forward", PATH + ".c_proj"),
        ("all_reduce", "backward", PATH + ".c_attn")]
    for e in ev:
        assert e.shape == (B, S, hidden) and e.bytes == B * S * hidden * 8 and e.group == "tp"


def hand_made_shards(hidden: int, group):
    """c_attn and c_proj shards of any width (one column, one row) — the sizes are only checked by attention."""
    return (ColumnParallelLinear(hidden, 3 * hidden, group, gather_output=False, columns=[0]),
            RowParallelLinear(hidden, hidden, group, input_is_parallel=True, rows=[0]))


def test_heads_not_divisible_by_tp_is_a_config_error(grid):
    if grid.tp == 1:
        pytest.skip("every head count divides by tp 1")
    heads = grid.tp + 1  # hidden divides by heads, heads does not divide by tp
    with pytest.raises(ConfigError, match=rf"heads = {heads} .* tp = {grid.tp}"):
        ParallelSelfAttention(*hand_made_shards(heads * 4, grid.tp_group), heads)
    with pytest.raises(ConfigError, match=rf"heads = {heads} .* tp = {grid.tp}"):
        ParallelSelfAttention.from_serial(CausalSelfAttention(heads * 4, heads), grid.tp_group)
    assert not grid.tracer.events, "the check must come before any collective"


def test_hidden_not_divisible_by_heads_is_a_config_error(grid):
    with pytest.raises(ConfigError, match="hidden = 10 is not divisible by heads = 4"):
        ParallelSelfAttention(*hand_made_shards(10, grid.tp_group), 4)
