"""The TP × DP × PP grid (Megatron's order: TP fastest, pipeline stages outermost) and traced point-to-point.

Every pipeline size the world allows (1, 2, 4, 8 that divide it), each with TP 1 and TP 2 where they fit.
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.comm import ProcessGrid, format_cube, grid_cube
from tpsim.errors import ConfigError
from tpsim.nn.precision import dtype_of
from conftest import WORLD

N = WORLD.Get_size()
LAYOUTS = [(tp, pp) for pp in (1, 2, 4, 8) for tp in (1, 2) if N % (tp * pp) == 0]
_GRIDS: dict[tuple[int, int], ProcessGrid] = {}


@pytest.fixture(params=LAYOUTS, ids=lambda tp_pp: f"tp{tp_pp[0]}-pp{tp_pp[1]}")
def grid(request) -> ProcessGrid:
    tp, pp = request.param
    if (tp, pp) not in _GRIDS:
        _GRIDS[tp, pp] = ProcessGrid(tp=tp, pp=pp)
    g = _GRIDS[tp, pp]
    g.tracer.reset()
    g.tracer.enabled = True
    return g


def test_cube_is_megatron_order():
    cube = grid_cube(8, 2, pp=2)
    assert cube.tolist() == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    text = format_cube(cube)
    assert "TP(2) x DP(2) x PP(2) = 8 ranks" in text and "rank = pp_rank·4 + dp_rank·2 + tp_rank" in text
    for line in ("TP group 3: ranks [6, 7]", "DP group 1: ranks [1, 3]", "DP group 2: ranks [4, 6]",
                 "PP group 0: ranks [0, 4]", "PP group 3: ranks [3, 7]", "embedding group 1: ranks [1, 5]"):
        assert line in text, line
    assert grid_cube(8, 2, pp=4)[:, 0, 1].tolist() == [1, 3, 5, 7]  # a pipeline group: same tp and dp rank


def test_coordinates_and_groups(grid):
    r, tp, dp, pp = grid.rank, grid.tp, grid.dp, grid.pp
    assert r == grid.pp_rank * dp * tp + grid.dp_rank * tp + grid.tp_rank
    assert grid.tp_group.ranks == tuple(grid.tp_groups[grid.pp_rank * dp + grid.dp_rank])
    assert grid.dp_group.ranks == tuple(grid.dp_groups[grid.pp_rank * tp + grid.tp_rank])
    assert grid.pp_group.ranks == tuple(grid.pp_groups[grid.dp_rank * tp + grid.tp_rank])
    assert grid.pp_group.rank == grid.pp_rank and grid.pp_group.size == pp
    for group in (grid.tp_group, grid.dp_group, grid.pp_group, grid.model_parallel_group):
        assert group.all_gather(np.array([r]), axis=0).tolist() == list(group.ranks), group
    if pp == 1:
        assert grid.embedding_group is None and grid.model_parallel_group is grid.tp_group
        return
    ends = grid.pp_rank in (0, pp - 1)
    assert (grid.embedding_group is not None) == ends
    if ends:
        assert grid.embedding_group.ranks == (grid.pp_group.ranks[0], grid.pp_group.ranks[-1])
    mp = grid.model_parallel_group
    assert mp.size == tp * pp and mp.rank == grid.pp_rank * tp + grid.tp_rank
    assert grid.describe().endswith(f"pp_rank {grid.pp_rank}")


def test_bad_pipeline_sizes_fail_before_any_collective():
    with pytest.raises(ConfigError, match="pp must be >= 1"):
        ProcessGrid(tp=1, pp=0)
    with pytest.raises(ConfigError, match=f"world size {N} is not divisible by tp x pp = 1 x {N + 1}"):
        ProcessGrid(tp=1, pp=N + 1)
    if N % 2 == 0:
        with pytest.raises(ConfigError, match=f"tp x dp x pp = 1 x {N} x 2 = {2 * N} does not match"):
            ProcessGrid(tp=1, dp=N, pp=2)


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_neighbours_exchange_at_once_and_every_message_is_recorded_twice(grid, dtype):
    """Every pipeline rank sends to the next and the previous one *before* receiving anything (the pattern that
    deadlocks with blocking sends), then receives in the opposite order of the sends: tags match them."""
    pp = grid.pp_group
    if pp.size == 1:
        pytest.skip("a pipeline of one rank has no neighbour")
    nxt, prev = (pp.rank + 1) % pp.size, (pp.rank - 1) % pp.size
    dt = dtype_of(dtype)
    mine = (np.arange(12.0).reshape(3, 4) + 100 * grid.rank).astype(dt)
    pp.send(mine, nxt, tag=1, microbatch=5)
    pp.send(mine[:, ::2] * 2, prev, tag=2, microbatch=6, chunk=1)  # not contiguous: sent as a copy
    back = pp.recv((3, 2), dt, nxt, tag=2, microbatch=6, chunk=1)
    fwd = pp.recv((3, 4), dt, prev, tag=1, microbatch=5)
    pp.wait_sends()
    assert pp.pending_sends == 0
    r_prev, r_next = pp.ranks[prev], pp.ranks[nxt]
    assert np.array_equal(fwd, (np.arange(12.0).reshape(3, 4) + 100 * r_prev).astype(dt))
    assert np.array_equal(back, ((np.arange(12.0).reshape(3, 4) + 100 * r_next)[:, ::2] * 2).astype(dt))
    ev = grid.tracer.events
    assert [(e.op, e.peer, e.microbatch, e.chunk, e.bytes, e.wire_bytes) for e in ev] == [
        ("send", r_next, 5, 0, 12 * dt.itemsize, 12 * dt.itemsize),
        ("send", r_prev, 6, 1, 6 * dt.itemsize, 6 * dt.itemsize),
        ("recv", r_next, 6, 1, 6 * dt.itemsize, 0),
        ("recv", r_prev, 5, 0, 12 * dt.itemsize, 0)]
    assert all(e.group == "pp" and e.dtype == dtype and e.as_dict()["peer"] == e.peer for e in ev)


def test_a_peer_outside_the_group_is_refused(grid):
    with pytest.raises(ValueError, match="is not another rank"):
        grid.pp_group.send(np.zeros(2), grid.pp_group.rank, tag=0)
