"""The rank grid by order string (``tpsim.rank_grid``) against two independent references.

- Megatron-LM's own worked example (``parallel_state.initialize_model_parallel``'s docstring: 16 GPUs, TP 2,
  PP 4, DP 2: TP groups [g0, g1], [g2, g3], ...; DP groups [g0, g2], [g1, g3], [g4, g6], ...; PP groups
  [g0, g4, g8, g12], ...) and the CP example of ``tpsim.comm.grid``'s docstring, written out;
- NumPy: the world as ``arange(world).reshape(sizes, latest axis first)``, a group the sub-array over its axes,
  read with the earliest axis fastest — for random orders, sizes and products (hypothesis);
- the process grid's cube (``grid_cube``, the reshape every live run has used), for every TP × CP × DP × PP of up
  to 16 ranks: its TP, DP × CP, CP, PP, model-parallel and stage groups are the order string's.
"""

from __future__ import annotations

from math import prod

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tpsim.comm import grid_cube
from tpsim.errors import ConfigError
from tpsim.rank_grid import RankGrid


def test_megatrons_sixteen_gpu_example():
    g = RankGrid("tp-dp-pp", {"tp": 2, "dp": 2, "pp": 4})
    assert g.groups("tp") == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 13), (14, 15)]
    assert g.groups("dp") == [(0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15)]
    assert g.groups("pp") == [(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)]
    # the model-parallel group (TP x PP) of rank 13 (tp 1, dp 0, pp 3): dp 0's ranks, tp fastest, in either spelling
    assert g.group(13, "pp", "tp") == g.group(13, "tp", "pp") == (0, 1, 4, 5, 8, 9, 12, 13)


def test_dp_times_cp_is_the_rows_of_a_stage_cp_fastest():
    g = RankGrid("tp-cp-dp-pp", {"tp": 2, "cp": 2, "dp": 2, "pp": 1})
    assert g.group(0, "tp") == (0, 1) and g.group(0, "cp") == (0, 2)
    assert g.group(0, "dp", "cp") == g.group(0, "cp", "dp") == (0, 2, 4, 6)
    assert g.coords(6) == {"tp": 0, "cp": 1, "dp": 1, "pp": 0} and g.rank(tp=1, cp=1, dp=1, pp=0) == 7
    assert [g.key(r, "dp", "cp") for r in (0, 2, 4, 6)] == [0, 1, 2, 3]


def numpy_group(order: str, sizes: dict, rank: int, names: tuple) -> tuple:
    axes = order.split("-")
    cube = np.arange(prod(sizes.values())).reshape([sizes[a] for a in reversed(axes)])  # first axis fastest
    where = np.argwhere(cube == rank)[0]
    index = tuple(slice(None) if a in names else int(where[i]) for i, a in enumerate(reversed(axes)))
    sub = cube[index]  # its dims: the group's axes, latest first — so C order reads the earliest fastest
    return tuple(int(r) for r in sub.ravel())


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.permutations(["tp", "cp", "ep", "dp", "pp"]), st.lists(st.integers(1, 3), min_size=5, max_size=5),
       st.data())
def test_any_order_and_product_is_numpys_sub_array(axes, sizes, data):
    order, size = "-".join(axes), dict(zip(axes, sizes))
    g = RankGrid(order, size)
    names = tuple(data.draw(st.lists(st.sampled_from(axes), min_size=1, max_size=5, unique=True)))
    rank = data.draw(st.integers(0, g.world - 1))
    assert g.group(rank, *names) == numpy_group(order, size, rank, names)
    assert g.rank(**g.coords(rank)) == rank
    groups = g.groups(*names)
    assert sorted(r for grp in groups for r in grp) == list(range(g.world))  # a partition of the world
    assert groups[g.color(rank, *names)][g.key(rank, *names)] == rank


CUBES = [(tp, cp, dp, pp) for tp in (1, 2, 4) for cp in (1, 2) for dp in (1, 2, 4) for pp in (1, 2, 4)
         if tp * cp * dp * pp <= 16]


@pytest.mark.parametrize("tp, cp, dp, pp", CUBES, ids=lambda x: str(x))
def test_the_process_grids_groups_are_the_order_strings(tp, cp, dp, pp):
    cube = grid_cube(tp * cp * dp * pp, tp, dp, pp, cp)  # [pp, dp·cp, tp]
    g = RankGrid("tp-cp-dp-pp", {"tp": tp, "cp": cp, "dp": dp, "pp": pp})
    as_tuples = lambda rows: [tuple(r) for r in rows]  # noqa: E731
    assert g.groups("tp") == as_tuples(cube.reshape(-1, tp).tolist())
    assert sorted(g.groups("dp", "cp")) == sorted(as_tuples(cube.transpose(0, 2, 1).reshape(-1, dp * cp).tolist()))
    assert sorted(g.groups("pp")) == sorted(as_tuples(cube.transpose(1, 2, 0).reshape(-1, pp).tolist()))
    four = cube.reshape(pp, dp, cp, tp).transpose(0, 1, 3, 2).reshape(-1, cp)
    assert sorted(g.groups("cp")) == sorted(as_tuples(four.tolist()))
    assert sorted(g.groups("tp", "pp")) == sorted(tuple(cube[:, row].ravel().tolist()) for row in range(dp * cp))
    assert g.groups("tp", "cp", "dp") == [tuple(cube[k].ravel().tolist()) for k in range(pp)]


@pytest.mark.parametrize("order, sizes, says", [
    ("tp-tp", {"tp": 2}, "each axis once"),
    ("tp-dp", {"tp": 2}, "no size for ['dp']"),
    ("tp", {"tp": 2, "ep": 2}, "['ep'] not in the order"),
    ("tp-dp", {"tp": 0, "dp": 2}, "whole number >= 1"),
])
def test_a_bad_order_or_size_is_one_line(order, sizes, says):
    with pytest.raises(ConfigError, match=None) as err:
        RankGrid(order, sizes)
    assert says in str(err.value) and "\n" not in str(err.value)
