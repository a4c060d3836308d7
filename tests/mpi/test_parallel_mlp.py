"""The parallel MLP vs the serial MLP, and its communication: one all-reduce forward, one backward."""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.nn.mlp import MLP
from tpsim.tp import ParallelMLP
from _util import assert_close, randn


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_parallel_mlp_equals_serial(grid, approximate):
    p, r = grid.tp, grid.tp_rank
    hidden, ffn = 13, 17 * p
    serial = MLP(hidden, ffn, rng=np.random.default_rng(11), std=0.3, approximate=approximate)
    mlp = ParallelMLP.from_serial(serial, grid.tp_group)
    x, dz = randn(1, 2, 13, hidden), randn(2, 2, 13, hidden)
    z_ref, c = serial.forward(x)
    dx_ref = serial.backward(dz, c)
    z, cache = mlp.forward(x)
    dx = mlp.backward(dz, cache)
    cols = slice(17 * r, 17 * (r + 1))
    assert_close(z, z_ref, 1e-12, "output")
    assert_close(dx, dx_ref, 1e-12, "input grad")
    assert_close(mlp.c_fc.grads["weight"], serial.c_fc.grads["weight"][:, cols], 1e-12, "c_fc.weight grad")
    assert_close(mlp.c_fc.grads["bias"], serial.c_fc.grads["bias"][cols], 1e-12, "c_fc.bias grad")
    assert_close(mlp.c_proj.grads["weight"], serial.c_proj.grads["weight"][cols], 1e-12, "c_proj.weight grad")
    assert_close(mlp.c_proj.grads["bias"], serial.c_proj.grads["bias"], 1e-12, "c_proj.bias grad")


def test_parallel_mlp_communication(grid):
    """Exactly one all-reduce forward (g, in c_proj) and one backward (f, in c_fc), each [tokens, hidden]."""
    tokens, hidden = 13, 8
    serial = MLP(hidden, rng=np.random.default_rng(0))
    mlp = ParallelMLP.from_serial(serial, grid.tp_group).set_path("transformer.h.0.mlp")
    x = randn(1, tokens, hidden)
    z, cache = mlp.forward(x)
    mlp.backward(np.ones_like(z), cache)
    ev = grid.tracer.events
    assert [(e.op, e.phase, e.scope) for e in ev] == [
        ("all_reduce", "forward", "transformer.h.0.mlp.c_proj"),
        ("all_reduce", "backward", "transformer.h.0.mlp.c_fc")]
    for e in ev:
        assert e.shape == (tokens, hidden) and e.bytes == tokens * hidden * 8 and e.group == "tp"
        assert e.wire_bytes == 2 * (grid.tp - 1) * e.bytes // grid.tp


def test_parallel_mlp_rejects_wrong_layer_options(grid):
    from tpsim.tp import ColumnParallelLinear, RowParallelLinear
    g = grid.tp_group
    with pytest.raises(ValueError, match="gather_output=False"):
        ParallelMLP(ColumnParallelLinear(4, 4 * grid.tp, g, gather_output=True),
                    RowParallelLinear(4 * grid.tp, 4, g, input_is_parallel=True))
    with pytest.raises(ValueError, match="input_is_parallel=True"):
        ParallelMLP(ColumnParallelLinear(4, 4 * grid.tp, g, gather_output=False),
                    RowParallelLinear(4 * grid.tp, 4, g, input_is_parallel=False))
