"""The grid table across machines (``tpsim.hosts``, ``format_grid(layout, hosts)``), with made-up host names:
pure formatting, no MPI. The every-rank side (the names really gathered) is in tests/mpi/test_grid.py."""

from __future__ import annotations

import pytest

from tpsim.comm.grid import format_grid, grid_layout
from tpsim.errors import ConfigError
from tpsim.hosts import parse_fake_hosts, rank_ranges, tp_groups_spanning_hosts


def test_fake_hosts_spec():
    assert parse_fake_hosts("a*2,b,c", 4) == ["a", "a", "b", "c"]
    assert parse_fake_hosts(" node-a*4 , node-b*4 ", 8) == ["node-a"] * 4 + ["node-b"] * 4
    with pytest.raises(ConfigError, match="names 3 ranks, but the world has 4"):
        parse_fake_hosts("a*2,b", 4)
    for bad in ("a*x", "*2", "a,,b", "a*"):
        with pytest.raises(ConfigError, match="is not NAME or NAME\\*COUNT"):
            parse_fake_hosts(bad, 2)


def test_rank_ranges():
    assert rank_ranges([0, 1, 2, 3, 6]) == "0-3, 6"
    assert rank_ranges([5, 3, 4, 9, 10]) == "3-5, 9-10"
    assert rank_ranges([7]) == "7"


def test_one_host_leaves_the_table_as_it_was():
    layout = grid_layout(8, 4)
    assert format_grid(layout, ["vm"] * 8) == format_grid(layout) == format_grid(layout, None)
    assert "host" not in format_grid(layout, ["vm"] * 8)


def test_two_machines_of_four_ranks_keep_each_tp4_group_inside_one():
    """Megatron's order with 4 ranks per machine and TP 4: each TP group is one machine, DP crosses."""
    text = format_grid(grid_layout(8, 4), ["node-a"] * 4 + ["node-b"] * 4)
    rows = [line.split() for line in text.splitlines() if line.strip().startswith("dp")]
    assert rows == [["dp0", "0", "1", "2", "3", "node-a"], ["dp1", "4", "5", "6", "7", "node-b"]]
    assert "  host node-a: ranks 0-3" in text and "  host node-b: ranks 4-7" in text
    assert "every TP group inside one" in text and "WARNING" not in text


def test_a_tp_group_across_machines_is_warned_about_in_one_line():
    hosts = ["n1"] * 3 + ["n2"] * 3 + ["n3"] * 2  # 3 ranks per machine: not a multiple of TP = 2
    text = format_grid(grid_layout(8, 2), hosts)
    warnings = [line for line in text.splitlines() if "WARNING" in line]
    assert warnings == ["WARNING: TP group [2, 3] spans hosts n1, n2: its all-reduces cross the slow link; "
                        "put a multiple of TP=2 ranks on each host"]
    assert "dp1   2   3   n1, n2" in text


def test_several_spanning_groups_still_one_line():
    hosts = ["a", "b"] * 4  # round-robin placement (e.g. mpiexec --map-by node): every TP pair crosses
    layout = grid_layout(8, 2)
    assert tp_groups_spanning_hosts(layout.tolist(), hosts) == layout.tolist()
    warnings = [line for line in format_grid(layout, hosts).splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and warnings[0].startswith("WARNING: TP group [0, 1] spans hosts a, b")
    assert "(and 3 more TP groups)" in warnings[0]
    assert "  host a: ranks 0, 2, 4, 6" in format_grid(layout, hosts)


def test_tp1_never_spans_hosts():
    text = format_grid(grid_layout(4, 1), ["a", "a", "b", "b"])
    assert "WARNING" not in text and "every TP group inside one" in text
