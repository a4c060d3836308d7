"""The schedule generators (``tpsim.pipeline.schedules``, ``interleaved``, ``zero_bubble``): every list they make
passes the checker, and each has the shape its paper gives it — warm-up counts, the order of micro-batches and
chunks, where ZB-H1 puts its W's — read off the lists, not restated from the code."""

from __future__ import annotations

import pytest

from tpsim.errors import ConfigError
from tpsim.pipeline import interleaved as interleaved_module
from tpsim.pipeline.check import check
from tpsim.pipeline.clock import simulate
from tpsim.pipeline.schedules import SCHEDULES, build
from tpsim.predict.pipeline import bubble_fraction


def valid_sizes(name: str, pps=range(1, 9), ms=range(1, 33), vps=range(1, 5)):
    for p in pps:
        for v in (vps if name == "interleaved" else (1,)):
            for m in ms:
                if name != "interleaved" or v == 1 or m % p == 0:
                    yield p, m, v


def compute(actions, ops=("F", "B", "W")):
    return [(a.op, a.microbatch, a.chunk) for a in actions if a.op in ops]


def first_backward(actions) -> int:
    """How many forwards a rank runs before its first backward."""
    ops = [a.op for a in actions if a.op in ("F", "B")]
    return ops.index("B")


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_every_generated_schedule_passes_the_checker(name):
    for p, m, v in valid_sizes(name, ms=(1, 2, 3, 4, 5, 8, 12, 16, 24, 32)):
        schedule = build(name, p, m, v)
        assert check(schedule) is schedule
        assert (schedule.pp, schedule.microbatches, schedule.vp, len(schedule.ranks)) == (p, m, v, p)


@pytest.mark.parametrize("p, m", [(p, m) for p in range(1, 9) for m in (1, 2, 3, 7, 8, 16)])
def test_1f1b_runs_min_p_minus_i_forwards_before_its_first_backward_and_afab_all_m(p, m):
    for i, actions in enumerate(build("1f1b", p, m).ranks):
        assert first_backward(actions) == min(p - i, m)
    for actions in build("afab", p, m).ranks:
        assert compute(actions) == [("F", j, 0) for j in range(m)] + [("B", j, 0) for j in range(m)]


@pytest.mark.parametrize("p, m", [(p, m) for p in range(1, 9) for m in (1, 2, 5, 8, 13)])
def test_interleaved_with_one_chunk_is_1f1b(p, m):
    assert build("interleaved", p, m, 1).ranks == build("1f1b", p, m).ranks


@pytest.mark.parametrize("p, v", [(p, v) for p in range(1, 9) for v in range(2, 5)])
def test_interleaved_warm_up_is_megatrons_count(p, v):
    for m in (p, 2 * p, 4 * p):
        for r, actions in enumerate(build("interleaved", p, m, v).ranks):
            assert first_backward(actions) == min((p - r - 1) * 2 + (v - 1) * p + 1, v * m)


@pytest.mark.parametrize("p, v", [(2, 2), (3, 2), (4, 3), (4, 4)])
def test_interleaved_takes_micro_batches_in_groups_of_p_through_every_chunk(p, v):
    m = 3 * p
    for r, actions in enumerate(build("interleaved", p, m, v).ranks):
        forwards = [(a.microbatch, a.chunk) for a in actions if a.op == "F"]
        groups = [forwards[g * p * v:(g + 1) * p * v] for g in range(m // p)]
        for g, group in enumerate(groups):
            assert group == [(g * p + j, c) for c in range(v) for j in range(p)]
        backwards = [(a.microbatch, a.chunk) for a in actions if a.op == "B"]
        assert backwards == [(j, v - 1 - c) for j, c in forwards]  # the gradient enters at the last chunk


@pytest.mark.parametrize("p, m, v", [(4, 6, 2), (2, 3, 2), (3, 4, 3), (8, 12, 2)])
def test_interleaved_refuses_m_not_a_multiple_of_p_in_one_line(p, m, v):
    with pytest.raises(ConfigError) as err:
        build("interleaved", p, m, v)
    message = str(err.value)
    assert "\n" not in message and f"--microbatches {m} must be a multiple of --pp {p}" in message


@pytest.mark.parametrize("p, m, v", [(4, 6, 2), (4, 5, 2), (2, 3, 2), (4, 2, 2)])
def test_the_constraint_is_real_without_it_the_bubble_is_larger(p, m, v, monkeypatch):
    """A last group smaller than p stalls the pipeline: lifted, the constraint lets through a slower schedule."""
    monkeypatch.setattr(interleaved_module, "check_microbatches", lambda *args: None)
    measured = simulate(build("interleaved", p, m, v)).bubble_fraction
    assert measured > (p - 1) / (v * m + p - 1) + 0.05


def test_without_the_constraint_a_schedule_can_even_deadlock(monkeypatch):
    monkeypatch.setattr(interleaved_module, "check_microbatches", lambda *args: None)
    with pytest.raises(ConfigError, match="deadlock"):
        check(build("interleaved", 4, 9, 3))


@pytest.mark.parametrize("p, m", [(p, m) for p in range(1, 9) for m in (1, 2, 3, 8, 13, 32)])
def test_zb_h1_keeps_1f1bs_forwards_and_backwards(p, m):
    for zb, plain in zip(build("zb-h1", p, m).ranks, build("1f1b", p, m).ranks):
        assert compute(zb, ("F", "B")) == compute(plain, ("F", "B"))
        assert [j for op, j, _ in compute(zb) if op == "W"] == list(range(m))


@pytest.mark.parametrize("p, m", [(p, m) for p in range(1, 9) for m in (p, p + 1, 2 * p, 32)])
def test_zb_h1_delays_stage_is_ws_by_i_micro_batches(p, m):
    """Qi et al.'s ZB-H1 (m ≥ p): stage i's W of micro-batch j follows its B of j + i; the i owed run last."""
    for i, actions in enumerate(build("zb-h1", p, m).ranks):
        order = compute(actions)
        for j in range(m - i):  # W of j runs right after B of j + i ...
            at = order.index(("W", j, 0))
            assert order[at - 1] == ("B", j + i, 0), (i, j, order)
        assert order[len(order) - i:] == [("W", j, 0) for j in range(m - i, m)]  # ... the i owed run last


@pytest.mark.parametrize("args, says", [
    (("gpipe", 4, 8, 1), "unknown"),
    (("1f1b", 0, 8, 1), "at least 1"),
    (("afab", 4, 0, 1), "at least 1"),
    (("1f1b", 4, 8, 2), "one model chunk per rank"),
    (("zb-h1", 4, 8, 2), "one model chunk per rank"),
])
def test_build_refuses_what_it_cannot_make_in_one_line(args, says):
    with pytest.raises(ConfigError, match=says) as err:
        build(*args)
    assert "\n" not in str(err.value)


def test_every_schedule_has_a_formula():
    for name in SCHEDULES:
        assert 0 <= bubble_fraction(name, 4, 8) < 1
