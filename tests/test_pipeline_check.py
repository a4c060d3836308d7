"""The checker (``tpsim.pipeline.check``): hand-broken schedules — a missing receive, an order that deadlocks, a
duplicate forward, a wrong peer, ... — each give one line naming the rank, the action and the problem, before
anything runs; ``walk`` runs what passes in an order where every message is sent before it is received."""

from __future__ import annotations

import pytest

from tpsim.errors import ConfigError
from tpsim.pipeline.actions import Action, Schedule
from tpsim.pipeline.check import check, walk
from tpsim.pipeline.schedules import SCHEDULES, build


def edited(schedule: Schedule, rank: int, edit) -> Schedule:
    """``schedule`` with rank ``rank``'s list replaced by ``edit(list)``."""
    ranks = list(schedule.ranks)
    ranks[rank] = tuple(edit(list(ranks[rank])))
    return Schedule(schedule.name, schedule.pp, schedule.microbatches, schedule.vp, tuple(ranks))


def without(actions, *drop):
    return [a for a in actions if a not in drop]


def error_of(schedule: Schedule) -> str:
    with pytest.raises(ConfigError) as err:
        check(schedule)
    message = str(err.value)
    assert "\n" not in message, message
    return message


def swap(actions, a, b):
    i, j = actions.index(a), actions.index(b)
    actions[i], actions[j] = actions[j], actions[i]
    return actions


ONE_F_ONE_B = build("1f1b", 2, 2)
FOUR = build("1f1b", 4, 4)


def test_a_missing_receive_names_the_send_left_without_one():
    broken = edited(ONE_F_ONE_B, 1, lambda acts: without(acts, Action("RECV_F", 1, 0, 0)))
    message = error_of(broken)
    assert "rank 0" in message and "SEND_F1→1" in message and "rank 1 has no matching RECV_F1" in message


def test_a_missing_send_names_the_receive_left_waiting():
    broken = edited(ONE_F_ONE_B, 1, lambda acts: without(acts, Action("SEND_B", 0, 0, 0)))
    message = error_of(broken)
    assert "rank 0" in message and "RECV_B0←1" in message and "no matching SEND_B0" in message


def test_a_swapped_order_that_deadlocks_names_the_cycle():
    """Rank 0 waits for micro-batch 0's gradient before it sends micro-batch 0's activation: legal on each rank
    (RECV_B before B, F before SEND_F), a cycle across two."""
    broken = edited(ONE_F_ONE_B, 0, lambda acts: swap(acts, Action("SEND_F", 0, 0, 1), Action("RECV_B", 0, 0, 1)))
    message = error_of(broken)
    assert "deadlock" in message and "cycle" in message
    assert "rank 0 waits at action 1 (RECV_B0←1) for rank 1" in message
    assert "rank 1 waits at action 0 (RECV_F0←0) for rank 0" in message


def test_the_cycle_leaves_out_ranks_that_only_wait_on_it():
    broken = edited(FOUR, 1, lambda acts: swap(acts, Action("SEND_F", 0, 0, 2), Action("RECV_B", 0, 0, 2)))
    message = error_of(broken)
    assert "rank 1 waits" in message and "rank 2 waits" in message
    assert "rank 0 waits" not in message and "rank 3 waits" not in message


def test_a_duplicate_forward():
    broken = edited(ONE_F_ONE_B, 0, lambda acts: acts[:1] + [Action("F", 0)] + acts[1:])
    message = error_of(broken)
    assert "rank 0, action 0 (F0)" in message and "appears 2 times" in message


def test_a_wrong_peer():
    broken = edited(FOUR, 1, lambda acts: [Action("SEND_F", a.microbatch, 0, 3) if a.op == "SEND_F" else a
                                           for a in acts])
    message = error_of(broken)
    assert "rank 1" in message and "SEND_F0→3" in message and "wrong peer 3" in message and "rank 2" in message


def test_a_missing_backward():
    broken = edited(FOUR, 2, lambda acts: without(acts, Action("B", 3)))
    assert "rank 2 never runs B of micro-batch 3 on chunk 0 (virtual stage 2)" in error_of(broken)


def test_a_missing_backward_with_every_message_around_it():
    """No send is left without its receive: what is missing is the stage's work itself."""
    broken = edited(FOUR, 2, lambda acts: without(acts, Action("RECV_B", 3, 0, 3), Action("B", 3),
                                                  Action("SEND_B", 3, 0, 1)))
    broken = edited(broken, 3, lambda acts: without(acts, Action("SEND_B", 3, 0, 2)))
    broken = edited(broken, 1, lambda acts: without(acts, Action("RECV_B", 3, 0, 2)))
    assert "rank 1 never runs RECV_B of micro-batch 3 on chunk 0 (virtual stage 1)" in error_of(broken)


def test_a_backward_before_its_forward():
    broken = edited(ONE_F_ONE_B, 1, lambda acts: swap(acts, Action("F", 0), Action("B", 0)))
    message = error_of(broken)
    assert "rank 1" in message and "(B0)" in message and "comes before F of micro-batch 0" in message


def test_a_send_before_the_compute_that_makes_it():
    broken = edited(ONE_F_ONE_B, 0, lambda acts: swap(acts, Action("F", 1), Action("SEND_F", 1, 0, 1)))
    assert "comes before F of micro-batch 1" in error_of(broken)


def test_a_second_send_of_one_message():
    broken = edited(ONE_F_ONE_B, 0, lambda acts: acts + [Action("SEND_F", 0, 0, 1)])
    assert "a second SEND_F of the same message" in error_of(broken)


def test_the_last_stage_has_no_one_to_send_an_activation_to():
    broken = edited(ONE_F_ONE_B, 1, lambda acts: acts + [Action("SEND_F", 0, 0, 0)])
    assert "rank 1" in (message := error_of(broken)) and "no neighbour to send to" in message


@pytest.mark.parametrize("action, says", [(Action("F", 5), "micro-batch 5 is not in 0..1"),
                                          (Action("F", 0, 1), "chunk 1 is not in 0..0")])
def test_micro_batches_and_chunks_that_do_not_exist(action, says):
    assert says in error_of(edited(ONE_F_ONE_B, 0, lambda acts: acts + [action]))


def test_w_only_in_a_schedule_that_splits_backward_and_then_for_every_micro_batch():
    zb = build("zb-h1", 2, 2)
    message = error_of(edited(zb, 1, lambda acts: without(acts, Action("W", 1))))
    assert "rank 1 never runs W of micro-batch 1" in message
    message = error_of(edited(zb, 0, lambda acts: swap(acts, Action("B", 0), Action("W", 0))))
    assert "(W0)" in message and "comes before B of micro-batch 0" in message


def test_a_list_per_rank():
    short = Schedule("1f1b", 2, 2, 1, ONE_F_ONE_B.ranks[:1])
    assert "1 action lists for --pp 2" in error_of(short)


@pytest.mark.parametrize("name, p, m, v", [(n, 4, 8, 1) for n in SCHEDULES] + [("interleaved", 3, 6, 2),
                                                                             ("interleaved", 1, 3, 4)])
def test_walk_runs_every_action_once_and_every_send_before_its_receive(name, p, m, v):
    schedule = build(name, p, m, v)
    seen, sent = [], set()
    for rank, i, action in walk(schedule):
        assert schedule.ranks[rank][i] == action
        seen.append((rank, i))
        if action.op.startswith("SEND"):
            sent.add(schedule.message(rank, action))
        if action.op.startswith("RECV"):
            assert schedule.message(rank, action) in sent
    assert sorted(seen) == [(r, i) for r in range(p) for i in range(len(schedule.ranks[r]))]
    per_rank = {r: [i for rank, i in seen if rank == r] for r in range(p)}
    assert all(order == sorted(order) for order in per_rank.values())  # each rank in its own order
