"""Column- and row-parallel linear vs the serial Linear built from the same master weights.

Story: draw a serial layer, shard it, run both on the same input and upstream gradient, and compare the
output, the input gradient and every parameter gradient (each shard with the matching slice of the serial one).
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.errors import ConfigError
from tpsim.nn import Linear
from tpsim.tp import ColumnParallelLinear, RowParallelLinear
from _util import assert_close, randn

TOL = 1e-12


@pytest.mark.parametrize("gather_output", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_column_parallel_equals_serial(grid, gather_output, bias):
    g, p, r = grid.tp_group, grid.tp, grid.tp_rank
    n_in, n_out = 11, 17 * p
    serial = Linear(n_in, n_out, bias=bias, rng=np.random.default_rng(7), std=0.5)
    layer = ColumnParallelLinear.from_serial(serial, g, gather_output=gather_output).set_path("col")
    cols = slice(17 * r, 17 * (r + 1))
    x, dy = randn(1, 2, 13, n_in), randn(2, 2, 13, n_out)

    y_ref, c_ref = serial.forward(x)
    dx_ref = serial.backward(dy, c_ref)
    y, cache = layer.forward(x)
    dx = layer.backward(dy if gather_output else dy[..., cols], cache)

    assert_close(y, y_ref if gather_output else y_ref[..., cols], TOL, "output")
    assert_close(dx, dx_ref, TOL, "input grad")
    assert_close(layer.grads["weight"], serial.grads["weight"][:, cols], TOL, "weight grad shard")
    if bias:
        assert_close(layer.grads["bias"], serial.grads["bias"][cols], TOL, "bias grad shard")
    ops = [(e.op, e.phase, e.scope) for e in grid.tracer.events]
    expected = ([("all_gather", "forward", "col")] if gather_output else []) + [("all_reduce", "backward", "col")]
    assert ops == expected


@pytest.mark.parametrize("input_is_parallel", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_row_parallel_equals_serial(grid, input_is_parallel, bias):
    g, p, r = grid.tp_group, grid.tp, grid.tp_rank
    n_in, n_out = 17 * p, 13
    serial = Linear(n_in, n_out, bias=bias, rng=np.random.default_rng(8), std=0.5)
    if bias:  # a non-zero bias, so "added once, after the reduction" is really tested
        serial.params["bias"][:] = randn(9, n_out)
    layer = RowParallelLinear.from_serial(serial, g, input_is_parallel=input_is_parallel).set_path("row")
    rows = slice(17 * r, 17 * (r + 1))
    x, dz = randn(1, 3, 13, n_in), randn(2, 3, 13, n_out)

    z_ref, c_ref = serial.forward(x)
    dx_ref = serial.backward(dz, c_ref)
    z, cache = layer.forward(x[..., rows] if input_is_parallel else x)
    dx = layer.backward(dz, cache)

    assert_close(z, z_ref, TOL, "output")
    assert_close(dx, dx_ref[..., rows] if input_is_parallel else dx_ref, TOL, "input grad")
    assert_close(layer.grads["weight"], serial.grads["weight"][rows], TOL, "weight grad shard")
    if bias:
        assert_close(layer.grads["bias"], serial.grads["bias"], TOL, "bias grad (replicated)")
    ops = [(e.op, e.phase, e.scope) for e in grid.tracer.events]
    expected = [("all_reduce", "forward", "row")] + ([] if input_is_parallel else [("all_gather", "backward", "row")])
    assert ops == expected


def test_master_weight_init_is_tp_invariant(grid):
    """Built without a serial layer, the shards are still slices of one master matrix drawn from the seed."""
    g, p, r = grid.tp_group, grid.tp, grid.tp_rank
    col = ColumnParallelLinear(6, 4 * p, g, rng=np.random.default_rng(5))
    row = RowParallelLinear(4 * p, 6, g, rng=np.random.default_rng(5))
    master_c = Linear(6, 4 * p, rng=np.random.default_rng(5)).params["weight"]
    master_r = Linear(4 * p, 6, rng=np.random.default_rng(5)).params["weight"]
    assert_close(col.params["weight"], master_c[:, 4 * r:4 * (r + 1)], 0, "column shard")
    assert_close(row.params["weight"], master_r[4 * r:4 * (r + 1)], 0, "row shard")


def test_chosen_rows_and_columns_hold_those_master_slices(grid):
    """``columns=`` and ``rows=`` pick any master positions (uneven class slices, whole heads); the rest is alike."""
    g, r = grid.tp_group, grid.tp_rank
    serial_c = Linear(5, 3 * grid.tp, rng=np.random.default_rng(6))
    serial_r = Linear(3 * grid.tp, 5, rng=np.random.default_rng(6))
    mine = np.arange(r, 3 * grid.tp, grid.tp)  # strided: not the default contiguous block
    col = ColumnParallelLinear.from_serial(serial_c, g, gather_output=False, columns=mine)
    row = RowParallelLinear.from_serial(serial_r, g, input_is_parallel=True, rows=mine)
    assert_close(col.params["weight"], serial_c.params["weight"][:, mine], 0, "column shard")
    assert_close(row.params["weight"], serial_r.params["weight"][mine], 0, "row shard")
    assert col.partition["weight"].index.tolist() == row.partition["weight"].index.tolist() == mine.tolist()
    with pytest.raises(ValueError, match="contiguous"):
        ColumnParallelLinear.from_serial(serial_c, g, columns=mine)  # gather_output=True needs the default split
    with pytest.raises(ValueError, match="contiguous"):
        RowParallelLinear.from_serial(serial_r, g, rows=mine)  # so does input_is_parallel=False


def test_indivisible_features_give_a_clear_error(grid):
    if grid.tp == 1:
        pytest.skip("every size divides by 1")
    with pytest.raises(ConfigError, match=f"out_features = {grid.tp + 1} is not divisible by the tensor-parallel"):
        ColumnParallelLinear(4, grid.tp + 1, grid.tp_group)
    with pytest.raises(ConfigError, match=f"in_features = {grid.tp + 1} is not divisible"):
        RowParallelLinear(grid.tp + 1, 4, grid.tp_group)
