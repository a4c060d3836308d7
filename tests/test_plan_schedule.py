"""The 1F1B schedule (``tpsim.plan.schedule``): its order, its dependencies, and the two numbers lesson 16 uses —
min(p − i, m) micro-batches in flight and a bubble of (p − 1)/m — from a simulation, not from the formulas."""

from __future__ import annotations

import itertools

import pytest

from tpsim.plan.schedule import actions, depends_on, grid, idle, in_flight, simulate

SIZES = [(p, m) for p, m in itertools.product((1, 2, 3, 4, 8), (1, 2, 3, 5, 8, 13))]


@pytest.mark.parametrize("p, m", SIZES)
def test_every_stage_runs_every_micro_batch_once_each_way(p, m):
    for order in actions(p, m):
        assert sorted(order) == sorted([("F", j) for j in range(m)] + [("B", j) for j in range(m)])
        assert [j for k, j in order if k == "F"] == list(range(m)) == [j for k, j in order if k == "B"]


@pytest.mark.parametrize("p, m", SIZES)
def test_stage_i_runs_p_minus_i_forwards_before_its_first_backward(p, m):
    for stage, order in enumerate(actions(p, m)):
        assert [k for k, _ in order].index("B") == min(p - stage, m)


@pytest.mark.parametrize("p, m", SIZES)
def test_in_flight_is_min_p_minus_i_and_m(p, m):
    assert in_flight(p, m) == [min(p - i, m) for i in range(p)]


@pytest.mark.parametrize("tf, tb", [(1, 1), (1, 2), (2, 3)])
@pytest.mark.parametrize("p, m", SIZES)
def test_the_bubble_is_p_minus_1_over_m_of_the_compute(p, m, tf, tb):
    compute = m * (tf + tb)
    assert [gap / compute for gap in idle(p, m, tf, tb)] == [(p - 1) / m] * p


@pytest.mark.parametrize("p, m", [(4, 6), (3, 2), (8, 16)])
def test_no_action_starts_before_what_it_waits_for_and_a_stage_runs_one_at_a_time(p, m):
    times = simulate(p, m)
    for (stage, kind, j), (start, end) in times.items():
        dep = depends_on(p, stage, kind, j)
        assert dep is None or times[dep][1] <= start
    for stage in range(p):
        spans = sorted(span for (s, _, _), span in times.items() if s == stage)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def test_the_grid_draws_every_time_unit_of_every_action():
    p, m, tf, tb = 4, 6, 1, 2
    rows = grid(p, m, tf, tb)
    cells = [row.split()[2:] for row in rows]  # after "stage i"
    assert len({len(c) for c in cells}) == 1 and len(cells[0]) == max(e for _, e in simulate(p, m, tf, tb).values())
    for row in cells:
        assert sum(c.startswith("F") for c in row) == m * tf and sum(c.startswith("B") for c in row) == m * tb
        assert row.count(".") == (p - 1) * (tf + tb)
