"""The traced communication layer: each collective's result, and the one record it leaves behind."""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.cost import wire_bytes
from _util import assert_close


def test_all_reduce_sum_max_min(grid):
    g = grid.tp_group
    x = np.arange(6, dtype=np.float64).reshape(2, 3) + 10 * g.rank
    ranks = np.arange(g.size)
    assert_close(g.all_reduce(x), g.size * np.arange(6).reshape(2, 3) + 10 * ranks.sum(), what="sum")
    assert_close(g.all_reduce(x, op="max"), np.arange(6).reshape(2, 3) + 10 * (g.size - 1), what="max")
    assert_close(g.all_reduce(x, op="min"), np.arange(6).reshape(2, 3), what="min")
    y = x.copy()
    out = g.all_reduce(y, inplace=True)
    assert out is y, "inplace all_reduce must reuse the buffer"
    with pytest.raises(ValueError, match="one of"):
        g.all_reduce(x, op="prod")


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_all_gather_and_reduce_scatter_along_axis(grid, axis):
    g = grid.tp_group
    rng = np.random.default_rng(3)
    full = [rng.standard_normal((3, 5, 7)) for _ in range(g.size)]  # rank r owns full[r]
    gathered = g.all_gather(full[g.rank], axis=axis)
    assert_close(gathered, np.concatenate(full, axis=axis), what=f"all_gather axis {axis}")

    big = [rng.standard_normal((3 * g.size, 5 * g.size, 7 * g.size)) for _ in range(g.size)]
    total = sum(big)
    chunk = np.split(total, g.size, axis=axis)[g.rank]
    assert_close(g.reduce_scatter(big[g.rank], axis=axis), chunk, what=f"reduce_scatter axis {axis}")


def test_reduce_scatter_rejects_indivisible(grid):
    if grid.tp == 1:
        pytest.skip("every length divides by 1")
    with pytest.raises(ValueError, match="not divisible"):
        grid.tp_group.reduce_scatter(np.zeros((grid.tp + 1,)), axis=0)


def test_broadcast_in_place(grid):
    g = grid.tp_group
    x = np.full(4, float(g.rank))
    assert g.broadcast(x, root=g.size - 1) is x
    assert_close(x, np.full(4, float(g.size - 1)), what="broadcast")


def test_every_call_leaves_one_record_with_bytes(grid):
    g, tr = grid.tp_group, grid.tracer
    p = g.size
    x = np.ones((13, 8), dtype=np.float32)  # 416 bytes
    with tr.region(scope="a.b", phase="forward"):
        g.all_reduce(x)
        g.all_gather(x, axis=0)
    with tr.region(phase="backward"):
        with tr.region(scope="a.c"):
            g.reduce_scatter(np.ones((13, 8 * p), dtype=np.float32))
        g.broadcast(x)
    ev = tr.events
    assert [e.op for e in ev] == ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]
    assert [(e.scope, e.phase) for e in ev] == [("a.b", "forward"), ("a.b", "forward"),
                                                ("a.c", "backward"), ("", "backward")]
    assert [e.bytes for e in ev] == [416, 416 * p, 416 * p, 416]
    assert [e.shape for e in ev] == [(13, 8), (13 * p, 8), (13, 8 * p), (13, 8)]
    assert ev[0].wire_bytes == 2 * (p - 1) * 416 // p
    assert ev[1].wire_bytes == ev[2].wire_bytes == (p - 1) * 416
    assert ev[3].wire_bytes == (416 if p > 1 else 0)
    assert all(e.group == "tp" and e.group_size == p and e.dtype == "float32" for e in ev)
    assert all(e.group_ranks == tuple(grid.tp_groups[grid.dp_rank]) for e in ev)
    assert all(e.duration >= 0 and e.start >= 0 for e in ev)


def test_tracing_off_and_reset(grid):
    g, tr = grid.tp_group, grid.tracer
    with tr.paused():
        g.all_reduce(np.ones(3))
    assert tr.events == []
    g.all_reduce(np.ones(3))
    assert len(tr.events) == 1
    tr.reset()
    assert tr.events == []


def test_records_gather_to_rank_zero(grid):
    tr = grid.tracer
    with tr.region(scope="s", phase="forward"):
        grid.tp_group.all_reduce(np.ones(2))
    records = grid.world.gather_objects([e.as_dict() for e in tr.events])
    if grid.rank == 0:
        assert len(records) == grid.world_size
        assert [r[0]["rank"] for r in records] == list(range(grid.world_size))
        assert all(r[0]["op"] == "all_reduce" and r[0]["scope"] == "s" for r in records)
    else:
        assert records is None


def test_wire_bytes_formulas():
    assert wire_bytes("all_reduce", 1000, 4) == 1500
    assert wire_bytes("all_gather", 1000, 4) == 750
    assert wire_bytes("reduce_scatter", 1000, 4) == 750
    assert wire_bytes("broadcast", 1000, 4) == 1000
    assert wire_bytes("all_reduce", 1000, 1) == 0
    assert wire_bytes("all_to_all", 1000, 4) == 750  # a rank keeps its own quarter
    with pytest.raises(ValueError):
        wire_bytes("all_to_one", 1, 2)


def test_all_to_all_sends_chunk_j_to_rank_j(grid):
    """Chunk j of every rank's split axis lands on rank j, laid along the concat axis in rank order."""
    world, p, r = grid.world, grid.world.size, grid.world.rank
    x = np.arange(2 * p * 3, dtype=np.float64).reshape(2, p, 3) + 1000 * r  # [2, p, 3]: chunk j = x[:, j]
    grid.tracer.reset()
    got = world.all_to_all(x, split_axis=1, concat_axis=2)  # [2, 1, 3p]
    want = np.concatenate([np.arange(2 * p * 3).reshape(2, p, 3)[:, r:r + 1] + 1000 * j for j in range(p)], axis=2)
    np.testing.assert_array_equal(got, want)
    (event,) = grid.tracer.events
    assert (event.op, event.bytes, event.wire_bytes) == ("all_to_all", x.nbytes, (p - 1) * x.nbytes // p)
