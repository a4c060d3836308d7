"""The process grid: Megatron rank order, per-rank coordinates, the printed table, size errors."""

from __future__ import annotations

import numpy as np
import pytest

from mpi4py import MPI

from tpsim.comm import ProcessGrid, Tracer, format_grid, grid_layout
from tpsim.errors import ConfigError
from tpsim.hosts import FAKE_HOSTS_ENV
from conftest import WORLD


def test_megatron_rank_order_world8():
    assert grid_layout(8, 4).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert grid_layout(8, 4).T.tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert grid_layout(8, 2).tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid_layout(8, 2).T.tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_coordinates_and_groups_match_layout(grid):
    r = grid.rank
    assert (grid.tp_rank, grid.dp_rank) == (r % grid.tp, r // grid.tp)
    assert grid.tp_group.ranks == tuple(grid.tp_groups[grid.dp_rank])
    assert grid.dp_group.ranks == tuple(grid.dp_groups[grid.tp_rank])
    assert grid.tp_group.rank == grid.tp_rank and grid.dp_group.rank == grid.dp_rank
    # the groups really contain those ranks: gather world ranks over each communicator
    members = grid.tp_group.all_gather(np.array([r]), axis=0).tolist()
    assert members == list(grid.tp_group.ranks)
    members = grid.dp_group.all_gather(np.array([r]), axis=0).tolist()
    assert members == list(grid.dp_group.ranks)
    assert grid.describe().startswith(f"TP({grid.tp}) DP({grid.dp}) rank {r}")


def test_printed_grid_world8():
    text = format_grid(grid_layout(8, 4))
    assert "TP(4) x DP(2) = 8 ranks" in text
    assert "TP group 0: ranks [0, 1, 2, 3]" in text and "TP group 1: ranks [4, 5, 6, 7]" in text
    for j, group in enumerate([[0, 4], [1, 5], [2, 6], [3, 7]]):
        assert f"DP group {j}: ranks {group}" in text
    rows = [line.split() for line in text.splitlines() if line.strip().startswith("dp")]
    assert rows == [["dp0", "0", "1", "2", "3"], ["dp1", "4", "5", "6", "7"]]


def test_bad_sizes_fail_on_every_rank_before_any_collective():
    n = WORLD.Get_size()
    with pytest.raises(ConfigError, match=f"world size {n} is not divisible by tp={n + 1}"):
        ProcessGrid(tp=n + 1)  # a collective inside would hang the ranks that did not raise
    with pytest.raises(ConfigError, match="does not match the world size"):
        ProcessGrid(tp=1, dp=n + 1)
    with pytest.raises(ConfigError, match="tp must be >= 1"):
        ProcessGrid(tp=0)


def test_every_rank_knows_every_ranks_host(grid):
    assert grid.hosts == WORLD.allgather(MPI.Get_processor_name())


def test_fake_hosts_reach_every_ranks_table_untraced(monkeypatch):
    """Half the ranks on "node-a", half on "node-b", all in one TP group: every rank's table warns; the
    host-name gather at construction records nothing (set-up, not model traffic)."""
    n = WORLD.Get_size()
    names = ["node-a"] * (n - n // 2) + ["node-b"] * (n // 2)
    monkeypatch.setenv(FAKE_HOSTS_ENV, ",".join(names))
    tracer = Tracer(rank=WORLD.Get_rank())
    tracer.reset = lambda t0=None: None  # keep whatever construction recorded
    grid = ProcessGrid(tp=n, tracer=tracer)
    try:
        assert grid.hosts == names and tracer.events == []
        text = grid.table()
        spans = n > 1
        assert ("WARNING: TP group " + str(list(range(n))) + " spans hosts node-a, node-b" in text) is spans
        assert ("  host node-b: ranks" in text) is spans
    finally:
        grid.tp_group.comm.Free()
        grid.dp_group.comm.Free()


def test_bad_fake_hosts_fail_on_every_rank_before_any_collective(monkeypatch):
    monkeypatch.setenv(FAKE_HOSTS_ENV, "a*99")
    with pytest.raises(ConfigError, match=f"names 99 ranks, but the world has {WORLD.Get_size()}"):
        ProcessGrid(tp=1)


def test_groups_by_name_are_the_order_strings(grid):
    """``grid.group(*axes)``: the groups the grid built, each over the ranks ``tpsim.rank_grid`` names for it (any
    spelling of a product), the same communicator as the attribute; a product never built is one error line."""
    assert grid.group("tp") is grid.tp_group and grid.group("cp", "dp") is grid.group("dp", "cp") is grid.dp_group
    assert grid.group("pp") is grid.pp_group and grid.group("tp", "pp") is grid.model_parallel_group
    assert grid.group("tp", "cp", "dp") is grid.stage_group
    for axes in (("tp",), ("dp", "cp"), ("cp",), ("pp",), ("tp", "pp"), ("tp", "cp", "dp")):
        assert grid.group(*axes).ranks == grid.ranks.group(grid.rank, *axes), axes
    with pytest.raises(ValueError, match="no group over dp on grid 'tp-cp-dp-pp'"):
        grid.group("dp")


@pytest.mark.skipif(WORLD.Get_size() != 8, reason="TP 2 x CP 2 x DP 2 needs 8 ranks")
def test_the_gradient_group_is_dp_times_cp_cp_fastest():
    grid = ProcessGrid(tp=2, dp=2, cp=2)
    assert grid.group("dp", "cp").ranks == tuple(grid.tp_rank + r for r in (0, 2, 4, 6))
    assert grid.group("cp").ranks == tuple(grid.dp_rank * 4 + grid.tp_rank + c for c in (0, 2))
    assert grid.dp_group.size == 4 and grid.replicas == 4
