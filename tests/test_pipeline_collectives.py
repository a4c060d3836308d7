"""Data parallelism's collectives as schedule actions (``tpsim.pipeline.collectives``): where the pass places them,
what the checker refuses, what the clock and ``tpsim schedule`` make of them.

The placement is checked against what the ZeRO paper (Rajbhandari et al. 2019, §5) and PyTorch's pipelining
state, in terms of the lists' own order — not of the rule's micro-batch arithmetic: the once-a-step reduction
comes after the *last* gradient-producing action of its chunk in the list, ZeRO-1/2's parameters are waited for
before the chunk's *first* forward, ZeRO-3 gathers around every F and B and never around a W.
"""

from __future__ import annotations

import pytest

from tpsim.errors import ConfigError
from tpsim.pipeline.actions import COLLECTIVES, COMPUTE, Action, Schedule
from tpsim.pipeline.check import check
from tpsim.pipeline.clock import simulate
from tpsim.pipeline.collectives import per_chunk, with_collectives, without_collectives
from tpsim.pipeline.schedules import build
from tpsim.schedule_cli import main as schedule_main
from tpsim.zero_stage import ZERO_STAGES, zero_stage

CASES = [("afab", 3, 4, 1), ("1f1b", 4, 6, 1), ("1f1b", 4, 2, 1), ("interleaved", 2, 4, 2), ("interleaved", 3, 6, 3),
         ("zb-h1", 4, 9, 1), ("zb-h1", 3, 2, 1)]


def neighbours(actions, i):
    """The compute actions right before and right after action ``i``, across collectives only."""
    def walk(step):
        k = i + step
        while 0 <= k < len(actions) and actions[k].op in COLLECTIVES:
            k += step
        return actions[k] if 0 <= k < len(actions) and actions[k].op in COMPUTE else None
    return walk(-1), walk(1)


@pytest.mark.parametrize("name, p, m, v", CASES)
@pytest.mark.parametrize("stage", list(ZERO_STAGES))
def test_each_stage_places_what_the_zero_paper_says_where_the_lists_say(name, p, m, v, stage):
    plain = build(name, p, m, v)
    placed = with_collectives(plain, zero_stage(stage))
    check(placed)
    grads = "W" if plain.splits_backward else "B"
    for r, actions in enumerate(placed.ranks):
        for c in range(v):
            compute = [a for a in actions if a.op in COMPUTE and a.chunk == c]
            mine = [(i, a) for i, a in enumerate(actions) if a.op in COLLECTIVES and a.chunk == c]
            reduces = [neighbours(actions, i)[0] for i, a in mine if a.op == "REDUCE_GRAD"]
            unshards = [neighbours(actions, i)[1] for i, a in mine if a.op == "UNSHARD"]
            reshards = [neighbours(actions, i)[0] for i, a in mine if a.op == "RESHARD"]
            producing = [a for a in compute if a.op == grads]
            if stage >= 2:  # every backward's gradients, reduce-scattered into the owned slices
                assert reduces == producing
            else:  # once, after the chunk's last gradient-producing action in the list
                assert reduces == [producing[-1]]
            if stage == 3:  # around every F and B, never a W (dW needs no parameters)
                assert unshards == reshards == [a for a in compute if a.op in ("F", "B")]
            elif stage in (1, 2):  # the last step's all-gathers waited for before the chunk's first forward
                assert unshards == [next(a for a in compute if a.op == "F")] and not reshards
            else:
                assert not unshards and not reshards


@pytest.mark.parametrize("name, p, m, v", CASES)
@pytest.mark.parametrize("stage", list(ZERO_STAGES))
def test_the_collectives_cost_no_compute_time_and_leave_the_lists_as_they_were(name, p, m, v, stage):
    """On the unit clock they take no time (their time is the comm stream's); taken out, the lists are the
    schedule's own; the planner's count per chunk is what the lists hold on every chunk."""
    plain = build(name, p, m, v)
    placed = with_collectives(plain, zero_stage(stage))
    a, b = simulate(plain), simulate(placed)
    assert (a.step, a.busy, a.bubble_fraction, a.p2p_bytes) == (b.step, b.busy, b.bubble_fraction, b.p2p_bytes)
    assert without_collectives(placed) == plain
    want = per_chunk(zero_stage(stage), m, plain.splits_backward)
    for actions in placed.ranks:
        for c in range(v):
            assert {op: sum(x.op == op and x.chunk == c for x in actions) for op in want} == dict(want)
            assert all(x.op in want for x in actions if x.op in COLLECTIVES)


def test_placing_twice_is_refused():
    placed = with_collectives(build("1f1b", 2, 2), zero_stage(3))
    with pytest.raises(ConfigError, match="carry collectives already"):
        with_collectives(placed, zero_stage(3))


def moved(schedule: Schedule, rank: int, edit) -> Schedule:
    ranks = list(schedule.ranks)
    ranks[rank] = tuple(edit(list(ranks[rank])))
    return Schedule(schedule.name, schedule.pp, schedule.microbatches, schedule.vp, tuple(ranks))


def swap(actions, i):
    actions[i], actions[i + 1] = actions[i + 1], actions[i]
    return actions


@pytest.mark.parametrize("edit, message", [
    (lambda a: swap(a, 0), r"UNSHARD0\): not right before F0 or B0 of chunk 0"),  # UNSHARD after its F
    (lambda a: a[:2] + [Action("REDUCE_GRAD", 0)] + a[2:], r"REDUCE_GRAD0\): not right after B0"),  # after an F
    (lambda a: a[:1] + [Action("UNSHARD", 0)] + a[1:], "a second UNSHARD on F0"),
    (lambda a: [Action("UNSHARD", 1)] + a, r"UNSHARD1\): not right before F1 or B1"),  # the wrong micro-batch
    (lambda a: a[:4] + [Action("RESHARD", 0)] + a[4:], r"RESHARD0\): not right after F0 or B0"),  # after SEND_F0
])
def test_a_misplaced_collective_is_one_line_naming_it(edit, message):
    placed = with_collectives(build("1f1b", 2, 2), zero_stage(3))
    with pytest.raises(ConfigError, match=message):
        check(moved(placed, 0, edit))


def test_under_a_split_backward_the_reduction_follows_w_not_b():
    placed = with_collectives(build("zb-h1", 2, 2), zero_stage(2))
    bad = moved(placed, 1, lambda a: [x for x in a if x.op != "REDUCE_GRAD"] + [])
    b = next(i for i, x in enumerate(bad.ranks[1]) if x.op == "B")
    bad = moved(bad, 1, lambda a: a[:b + 1] + [Action("REDUCE_GRAD", a[b].microbatch)] + a[b + 1:])
    with pytest.raises(ConfigError, match=r"not right after W0"):
        check(bad)


def test_a_collective_names_no_peer():
    with pytest.raises(ValueError, match="a collective none"):
        Action("REDUCE_GRAD", 0, 0, peer=1)


def test_tpsim_schedule_prints_the_lists_and_the_stage_rule(capsys):
    assert schedule_main(["--pp", "2", "--microbatches", "4", "--schedule", "interleaved", "--vp", "2",
                          "--zero", "3"]) == 0
    out = capsys.readouterr().out
    assert "rank 0: UNSHARD0 F0 RESHARD0 SEND_F0→1" in out
    assert "each chunk's collectives a step: UNSHARD 8, RESHARD 8, REDUCE_GRAD 4\n" in out
    assert "ZeRO-3's rule: UNSHARD 2m and RESHARD 2m" in out
    assert schedule_main(["--pp", "2", "--microbatches", "3", "--zero", "1"]) == 0
    out = capsys.readouterr().out
    assert "each chunk's collectives a step: UNSHARD 1, REDUCE_GRAD 1\n" in out
