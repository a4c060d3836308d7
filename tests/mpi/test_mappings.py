"""f, g, scatter and gather against their definitions: forward and backward, on real ranks."""

from __future__ import annotations


from tpsim.tp import CopyToTPRegion, GatherFromTPRegion, ReduceFromTPRegion, ScatterToTPRegion
from _util import assert_close, randn


def test_f_is_identity_forward_and_all_reduce_backward(grid):
    g = grid.tp_group
    x = randn(1, 13, 5)
    assert CopyToTPRegion.forward(x, g) is x
    dy = randn(2 + g.rank, 13, 5)  # each rank holds a different partial gradient
    expected = sum(randn(2 + r, 13, 5) for r in range(g.size))
    assert_close(CopyToTPRegion.backward(dy, g), expected, what="f backward")
    assert [(e.op, e.phase) for e in grid.tracer.events] == [("all_reduce", "backward")]


def test_g_is_all_reduce_forward_and_identity_backward(grid):
    g = grid.tp_group
    x = randn(10 + g.rank, 13, 5)
    assert_close(ReduceFromTPRegion.forward(x, g), sum(randn(10 + r, 13, 5) for r in range(g.size)), what="g fwd")
    dy = randn(3, 13, 5)
    assert ReduceFromTPRegion.backward(dy, g) is dy
    assert [(e.op, e.phase) for e in grid.tracer.events] == [("all_reduce", "forward")]


def test_scatter_and_gather_are_each_others_inverse(grid):
    g = grid.tp_group
    p = g.size
    full = randn(4, 13, 17 * p)
    mine = ScatterToTPRegion.forward(full, g)
    assert_close(mine, full[:, 17 * g.rank:17 * (g.rank + 1)], what="scatter fwd")
    assert_close(GatherFromTPRegion.forward(mine, g), full, what="gather fwd")
    dfull = randn(5, 13, 17 * p)
    assert_close(GatherFromTPRegion.backward(dfull, g), dfull[:, 17 * g.rank:17 * (g.rank + 1)], what="gather bwd")
    assert_close(ScatterToTPRegion.backward(GatherFromTPRegion.backward(dfull, g), g), dfull, what="scatter bwd")
    assert [(e.op, e.phase) for e in grid.tracer.events] == [("all_gather", "forward"), ("all_gather", "backward")]
