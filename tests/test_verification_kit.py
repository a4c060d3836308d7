"""The verification kit on its own: one difference (tpsim.compare), one table formatter (tpsim.table)."""

import numpy as np
import pytest

from tpsim.compare import max_abs_diff, relative_difference, shard_differences, shard_error
from tpsim.nn.gradcheck import relative_error
from tpsim.nn.module import Module
from tpsim.partition import Partition
from tpsim.table import RULE, column_widths, format_table


def test_max_abs_diff_is_inf_for_nan_or_a_shape_mismatch_and_zero_when_empty():
    assert max_abs_diff([1.0, 2.0], [1.0, 2.5]) == 0.5
    assert max_abs_diff([1.0, np.nan], [1.0, 2.0]) == float("inf")
    assert max_abs_diff(np.zeros(3), np.zeros(4)) == float("inf")
    assert max_abs_diff(np.zeros(0), np.zeros(0)) == 0.0


def test_relative_difference_divides_by_the_reference_scale_never_below_the_floor():
    expected = np.array([100.0, -200.0])
    assert relative_difference(expected + 1.0, expected) == 1.0 / 200.0
    small = np.array([1e-3, 0.0])
    assert relative_difference(small + 1e-6, small) == pytest.approx(1e-6)  # floor 1: absolute below 1
    assert relative_difference(small + 1e-6, small, floor=1e-30) == pytest.approx(1e-3)
    assert relative_difference(np.ones(2), np.zeros(2), floor=0.0) == 1.0  # a zero scale: the absolute difference


def test_gradcheck_measures_against_the_larger_of_the_two_scales():
    analytic, numeric = np.array([4.0, 0.0]), np.array([2.0, 0.0])
    assert relative_error(analytic, numeric) == 0.5 == relative_error(numeric, analytic)
    assert relative_error(np.zeros(3), np.zeros(3)) == 0.0


class Shard(Module):
    """Columns 1 and 3 of a [2, 4] master weight, and a replicated bias."""

    def __init__(self, master_w, master_b):
        super().__init__()
        part = Partition(dim=1, index=np.array([1, 3]), full=4)
        self.add_param("weight", master_w[:, [1, 3]], part)
        self.add_param("bias", master_b)


def test_shard_differences_compare_each_shard_with_its_slice_of_the_master():
    rng = np.random.default_rng(0)
    master = {"weight": rng.standard_normal((2, 4)), "bias": rng.standard_normal(3)}
    shard = Shard(master["weight"], master["bias"])
    assert shard_differences(shard, master, grads=False) == {"weight": 0.0, "bias": 0.0}
    shard.grads["weight"][0, 1] = 0.25  # master column 3
    grads = {"weight": np.zeros((2, 4)), "bias": np.zeros(3)}
    assert shard_error(shard, grads) == 0.25
    grads["weight"][0, 3] = 0.25
    grads["weight"][1, 0] = 7.0  # a column this shard does not hold: not its business
    assert shard_error(shard, grads) == 0.0
    master["weight"] *= 10
    rel = shard_differences(Shard(master["weight"] * 1.01, master["bias"]), master, grads=False, floor=1e-30)
    assert rel == {"weight": pytest.approx(0.01), "bias": 0.0}  # relative: the ×10 scale does not matter


def test_format_table_aligns_columns_and_draws_rules():
    rows = [["op", "calls", "bytes"], RULE, ["all_reduce", "2", "64.0 KiB"], ["", "10", "1 B"]]
    assert column_widths(rows) == [10, 5, 8]
    assert format_table(rows, title="per rank:").split("\n") == [
        "per rank:",
        "op          calls     bytes",
        "----------  -----  --------",
        "all_reduce      2  64.0 KiB",
        "               10       1 B"]
    assert format_table([["a", "bb"], ["ccc", "d"]], right=()) == "a    bb\nccc  d"  # no trailing spaces
    assert format_table([["a", "b", "c"]], sep=[" | ", "   "]) == "a | b   c"
