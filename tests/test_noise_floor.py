"""The final-state verdict's yardstick (tpsim/demo/noise_floor.py), without MPI: the one-ulp nudge, the state
differences it is measured by, and the rule that turns a difference and a floor into MATCH, MISMATCH or NOT
DECIDED. The demo runs that use it are in tests/test_demo_verdicts.py."""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.demo.noise_floor import (DECIDABLE, NOISE_FACTOR, SIGNS_SEEDS, floor_ranks, judge, nudge, state_differences,
                                    tolerance)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_nudge_moves_every_nonzero_weight_by_about_one_ulp_and_is_the_same_every_time(dtype):
    rng = np.random.default_rng(7)
    start = [rng.normal(size=(13, 17)).astype(dtype), np.zeros(11, dtype), np.ones(5, dtype)]
    a, b = [p.copy() for p in start], [p.copy() for p in start]
    nudge(a, 0)
    nudge(b, 0)
    for before, after, again in zip(start, a, b):
        assert after.dtype == dtype
        np.testing.assert_array_equal(after, again)  # a fixed sign pattern: the verdict is deterministic
        steps = np.abs(after - before) / np.spacing(np.abs(before).astype(dtype))
        moved = before != 0
        assert np.all(steps[moved] >= 0.5) and np.all(steps[moved] <= 2.0), steps  # 1 ulp, 2 just below a power of 2
        assert np.all(after[~moved] == 0)  # zeros (biases at the start) stay zero
    assert {-1.0, 1.0} <= set(np.sign(a[0] - start[0]).ravel())  # both directions, not a uniform rescaling
    other = [p.copy() for p in start]
    nudge(other, 1)
    assert not np.array_equal(other[0], a[0])  # each seed its own pattern


def test_the_sign_patterns_train_on_the_last_ranks_and_fit_any_world():
    assert floor_ranks(8) == [7, 6, 5] and floor_ranks(2) == [1, 0, 1] and floor_ranks(1) == [0, 0, 0]
    assert len(floor_ranks(8)) == len(SIGNS_SEEDS)


def test_state_differences_measure_each_kind_against_its_largest_serial_value():
    expected = [2.0, np.array([1.0, -4.0]), np.array([0.5]),  # loss, two params
                np.array([0.1, 0.2]), np.array([0.0]),  # their exp_avg
                np.array([1e-6, 0.0]), np.array([2e-6])]  # their exp_avg_sq
    got = [2.002, np.array([1.0, -4.0]), np.array([0.54]),
           np.array([0.1, 0.2]), np.array([0.002]),
           np.array([1e-6, 0.0]), np.array([2e-6])]
    loss, param, exp_avg, exp_avg_sq = state_differences(got, expected)
    assert loss == pytest.approx(1e-3)
    assert param == pytest.approx(0.04 / 4.0)  # the 0.5 parameter's Δ, over the largest parameter value (4)
    assert exp_avg == pytest.approx(0.002 / 0.2)  # an exactly-zero serial value does not divide by zero
    assert exp_avg_sq == 0.0


def test_the_tolerance_is_ten_noise_floors_of_the_most_amplified_kind_and_never_below_step_0s():
    assert NOISE_FACTOR == 10.0
    assert tolerance([0.0, 1e-15, 1e-16, 0.0], step0_tolerance=1e-10) == 1e-10
    assert tolerance([1e-9, 3e-8, 2.5e-7, 1e-7], step0_tolerance=1e-10) == pytest.approx(2.5e-6)
    assert tolerance([1e-9, np.nan, 0.0, 0.0], step0_tolerance=1e-10) == np.inf  # the nudged twin diverged


def test_the_rule_says_match_mismatch_or_not_decided():
    assert judge([1e-9, 2e-8], 1e-7) is True
    assert judge([1e-9, 2e-7], 1e-7) is False
    assert judge([np.nan, 0.0], 1e-7) is False  # a parallel run gone NaN is a mismatch, not "within"
    assert judge([1e-9, 0.3], 5.0) is None  # within a tolerance that could pass a bug: undecided
    assert judge([1e-9, 6.0], 5.0) is False  # beyond even that: a mismatch is still a mismatch
    assert judge([0.0], DECIDABLE) is True and judge([0.0], 2 * DECIDABLE) is None
    assert judge([0.0], np.inf) is None
