"""The virtual clock (``tpsim.pipeline.clock``) against the closed formulas (``tpsim.predict.pipeline``): at unit
costs the simulated bubble, micro-batches in flight and point-to-point bytes equal each schedule's formula to
1e-9 for p = 1..8, m = 1..32, v = 1..4 (where the schedule takes m); with any costs, the timeline keeps the
semantics (an action starts when its rank is free and its message has arrived, never earlier, never later)."""

from __future__ import annotations

import random

import pytest

from tpsim.pipeline.actions import COMPUTE, RECVS, SENDS
from tpsim.pipeline.clock import Costs, simulate, uniform, unit
from tpsim.pipeline.schedules import SCHEDULES, build
from tpsim.predict.pipeline import bubble_fraction, p2p_bytes, peak_in_flight
from time_invariants import timeline_problems


def sizes(name: str, p: int):
    for v in (range(1, 5) if name == "interleaved" else (1,)):
        for m in range(1, 33):
            if name != "interleaved" or v == 1 or m % p == 0:
                yield m, v


@pytest.mark.parametrize("p", range(1, 9))
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_unit_cost_bubble_and_in_flight_equal_the_formulas(name, p):
    for m, v in sizes(name, p):
        t = simulate(build(name, p, m, v))
        assert abs(t.bubble_fraction - bubble_fraction(name, p, m, v)) <= 1e-9, (name, p, m, v, t.bubble_fraction)
        assert t.peak_in_flight == peak_in_flight(name, p, m, v), (name, p, m, v)
        sends = sum(a.op in SENDS for actions in t.schedule.ranks for a in actions)
        assert sends == p2p_bytes(name, p, m, v, micro_batch=1, seq_len=1, hidden=1, bytes_per_element=1)
        assert all(abs(b - 3 * m) <= 1e-9 for b in t.busy)  # F 1 + B 2 (or B 1 + W 1) a stage, v chunks of 1/v
        assert all(abs(i - (t.step - 3 * m)) <= 1e-9 for i in t.idle)


@pytest.mark.parametrize("name, p, m, v", [("afab", 4, 8, 1), ("1f1b", 3, 5, 1), ("interleaved", 4, 8, 2),
                                           ("interleaved", 2, 6, 3), ("zb-h1", 4, 7, 1)])
@pytest.mark.parametrize("tp, sp", [(1, False), (2, False), (4, True)])
def test_p2p_bytes_equal_the_formula(name, p, m, v, tp, sp):
    b, s, h, e = 3, 11, 16, 8
    tensor = b * s * h * e / (tp if sp else 1)
    t = simulate(build(name, p, m, v), Costs(unit(build(name, p, m, v)).compute, message_bytes=lambda *_: tensor))
    want = p2p_bytes(name, p, m, v, micro_batch=b, seq_len=s, hidden=h, bytes_per_element=e, tp=tp,
                     sequence_parallel=sp)
    assert t.p2p_bytes == want == 2 * m * (v * p - 1) * tensor


@pytest.mark.parametrize("p", range(1, 9))
def test_one_micro_batch_takes_the_whole_pipeline_and_every_hop_costs_alpha_plus_beta_bytes(p):
    """m = 1 is one chain: p forwards, p backwards and 2(p − 1) messages, each α + β·bytes."""
    tf, tb, alpha, beta, n = 1.5, 2.25, 0.125, 1e-3, 500.0
    t = simulate(build("1f1b", p, 1), uniform(tf, tb, alpha=alpha, beta=beta, message_bytes=lambda *_: n))
    assert t.step == pytest.approx(p * (tf + tb) + 2 * (p - 1) * (alpha + beta * n), abs=1e-12)


@pytest.mark.parametrize("tf, tb", [(1, 1), (1, 2), (2, 3)])
@pytest.mark.parametrize("p, m", [(p, m) for p in (1, 2, 3, 4, 8) for m in (1, 2, 3, 5, 8, 13)])
def test_1f1b_idles_p_minus_1_times_tf_plus_tb_for_any_uniform_costs(p, m, tf, tb):
    """Narayanan et al. 2021 §2.2.1: the bubble is (p − 1)(t_f + t_b) a stage, whatever t_f and t_b."""
    t = simulate(build("1f1b", p, m), uniform(tf, tb))
    assert t.idle == [(p - 1) * (tf + tb)] * p


@pytest.mark.parametrize("p, m", [(p, m) for p in range(2, 9) for m in (p, p + 3, 32)])
def test_zb_h1_idles_only_before_each_stages_first_backward(p, m):
    """Qi et al. 2023: with m ≥ p each stage's p − 1 idle units all come before its first B; no tail at all."""
    t = simulate(build("zb-h1", p, m))
    for actions, spans in zip(t.schedule.ranks, t.spans):
        work = [(s, e) for a, (s, e) in zip(actions, spans) if a.op in COMPUTE]
        first_b = next(s for a, (s, _) in zip(actions, spans) if a.op == "B")
        gaps = [(end, start) for (_, end), (start, _) in zip([(0, 0)] + work, work) if start > end]
        assert sum(b - a for a, b in gaps) == pytest.approx(p - 1) and all(b <= first_b for _, b in gaps)
        assert work[-1][1] == pytest.approx(t.step)


@pytest.mark.parametrize("p, m", [(p, m) for p in range(2, 9) for m in range(1, p)])
def test_zb_h1_with_fewer_micro_batches_than_stages(p, m):
    """m < p: the last stage's last B ends at p + 2m − 1, stage 0's last W at 2m + 2p − 1."""
    t = simulate(build("zb-h1", p, m))
    last = t.schedule.ranks[p - 1]
    assert t.spans[p - 1][last.index(next(a for a in last if a.op == "B" and a.microbatch == m - 1))][1] == \
        pytest.approx(p + 2 * m - 1)
    assert t.finish[0] == t.step == pytest.approx(2 * m + 2 * p - 1)


def random_costs(seed: int) -> Costs:
    rng = random.Random(seed)
    table: dict = {}

    def cost(op):
        return lambda r, c, j: table.setdefault((op, r, c, j), rng.uniform(0.5, 3.0))

    return Costs({op: cost(op) for op in COMPUTE}, alpha=0.3, beta=0.01,
                 message_bytes=lambda d, j, s: table.setdefault((d, j, s), rng.uniform(0, 100)))


@pytest.mark.parametrize("name, p, m, v", [("afab", 3, 4, 1), ("1f1b", 4, 6, 1), ("interleaved", 4, 8, 2),
                                           ("interleaved", 3, 6, 4), ("zb-h1", 4, 9, 1)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_with_any_costs_an_action_starts_when_its_rank_is_free_and_a_receive_ends_when_its_message_arrives(
        name, p, m, v, seed):
    """Real per-stage costs (uneven stages, a heavier LM head) are just other cost functions: the same rules."""
    schedule, costs = build(name, p, m, v), random_costs(seed)
    t = simulate(schedule, costs)
    sent = {}
    for rank, (actions, spans) in enumerate(zip(schedule.ranks, t.spans)):
        for a, (s, e) in zip(actions, spans):
            if a.op in SENDS:
                key = schedule.message(rank, a)
                sent[key] = s + costs.alpha + costs.beta * costs.message_bytes(*key)
    for rank, (actions, spans) in enumerate(zip(schedule.ranks, t.spans)):
        free = 0
        for a, (s, e) in zip(actions, spans):
            assert s == free  # no gap a rank did not have to wait
            if a.op in COMPUTE:
                assert e - s == pytest.approx(costs.compute[a.op](rank, a.chunk, a.microbatch), abs=1e-12)
            elif a.op in RECVS:  # the clock adds the hop α + β·bytes as one number: the last bit may differ
                assert e == pytest.approx(max(s, sent[schedule.message(rank, a)]), rel=1e-15, abs=0)
            else:
                assert e == s  # a send never waits
            free = e
    assert sum(t.busy) == pytest.approx(sum(e - s for acts, spans in zip(schedule.ranks, t.spans)
                                            for a, (s, e) in zip(acts, spans) if a.op in COMPUTE))
    assert t.bubble_fraction == pytest.approx(sum(t.idle) / (p * t.step))
    assert not timeline_problems(t)


def test_a_heavier_last_stage_lengthens_the_step_by_what_the_formula_leaves_out():
    """Uniform stages give the formula; a last stage twice as heavy (the LM head) does not, and the clock says
    by how much: here every micro-batch waits on the slow stage, step = (p − 1)(t_f + t_b) + m·(slow stage)."""
    p, m = 4, 8
    heavy = Costs({"F": lambda r, c, j: 2.0 if r == p - 1 else 1.0, "B": lambda r, c, j: 4.0 if r == p - 1 else 2.0})
    t = simulate(build("1f1b", p, m), heavy)
    assert t.step == pytest.approx((p - 1) * 3 + m * 6)
    assert t.bubble_fraction > bubble_fraction("1f1b", p, m)


def test_in_flight_is_released_by_w_when_backward_is_split():
    zb = build("zb-h1", 4, 8)
    assert simulate(zb).peak_in_flight == [4, 4, 4, 4]  # 1F1B's rank-0 peak on every rank
    assert simulate(build("1f1b", 4, 8)).peak_in_flight == [4, 3, 2, 1]
