"""The MPI tags of the pipeline's point-to-point messages: one tag a message between two ranks, over a whole step.

Fault 3 of four ("point-to-point tags can collide: MPI's in-order matching hid it"). ``tpsim.live_pipeline.executor``
posts every activation and gradient with ``message_tag(direction, micro-batch, sender's virtual stage, stages)`` and
the receiver asks for exactly that tag. MPI matches a receive by (communicator, source, tag), so two different
messages from one rank to another under one tag can meet the wrong receive — yet only where the receiver asks in
another order than the sender posted, which the plain schedules never do: MPI's non-overtaking rule hands such
messages over in order and a bad formula passes every live run. Interleaving is where it bites: rank r sends
forward from each of its vp chunks to the same next rank, so two stages' messages share one pair of ranks.

So the check is on the schedules themselves, for every one ``tpsim.pipeline.schedules.build`` makes (afab, 1f1b,
interleaved, zb-h1; pp <= 8, vp <= 4, m <= 16), with the tags the executor posts and asks for
(``tpsim.live_pipeline.executor.action_tag``, which both its SEND and its RECV call): (a) no two different messages
between the same (sender, receiver) share a tag; (b) each RECV asks for the tag its SEND (the same ``Schedule.message``)
was posted under; (c) every tag lies in [0, top], ``top`` being the tag the executor checks against MPI's TAG_UB, itself
within the 32767 MPI promises. A last test spells out a collision a wrong formula makes.

Importing ``tpsim.live_pipeline.executor`` loads mpi4py (through ``tpsim.comm``): a world of one, no mpiexec, no rank
started — as ``test_properties.py`` does by importing ``tpsim.comm``.
"""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tpsim.errors import ConfigError
from tpsim.pipeline.actions import RECVS, SENDS, Action, Schedule
from tpsim.pipeline.schedules import SCHEDULES, build
from tpsim.live_pipeline.executor import BACKWARD_MESSAGE, FORWARD_MESSAGE, action_tag, message_tag

MPI_TAG_UB_FLOOR = 32767  # the MPI standard: MPI_TAG_UB is at least this on every implementation


def formula_tag(tag):
    """An ``action_tag`` built on another tag formula ``tag(direction, micro-batch, sender stage, stages)``."""
    def tagged(schedule: Schedule, rank: int, a: Action) -> int:
        direction, microbatch, sender = schedule.message(rank, a)
        return tag(FORWARD_MESSAGE if direction == "F" else BACKWARD_MESSAGE, microbatch, sender, schedule.stages)
    return tagged


def sends(schedule: Schedule, tag=action_tag) -> list[tuple[int, int, int, tuple[str, int, int]]]:
    """Every SEND of the step as (sender rank, receiver rank, tag, ``Schedule.message``), in the ranks' order."""
    return [(r, a.peer, tag(schedule, r, a), schedule.message(r, a))
            for r, actions in enumerate(schedule.ranks) for a in actions if a.op in SENDS]


def receives(schedule: Schedule, tag=action_tag) -> list[tuple[int, int, int, tuple[str, int, int]]]:
    """Every RECV of the step as (sender rank, receiver rank, tag, ``Schedule.message``)."""
    return [(a.peer, r, tag(schedule, r, a), schedule.message(r, a))
            for r, actions in enumerate(schedule.ranks) for a in actions if a.op in RECVS]


def first_collision(schedule: Schedule, tag) -> tuple | None:
    """The first two different messages one rank sends another under one tag, as (sender, receiver, tag, the
    earlier message, the later one), scanning the ranks' lists in order; None when there is none."""
    seen: dict[tuple[int, int, int], tuple[str, int, int]] = {}
    for sender, receiver, t, message in sends(schedule, tag):
        earlier = seen.setdefault((sender, receiver, t), message)
        if earlier != message:
            return sender, receiver, t, earlier, message
    return None


@settings(max_examples=250, deadline=None)
@given(name=st.sampled_from(sorted(SCHEDULES)), pp=st.integers(1, 8), vp=st.integers(1, 4), m=st.integers(1, 16))
def test_every_message_between_two_ranks_has_its_own_tag_and_its_receive_asks_for_it(name, pp, vp, m):
    """(a) tags unique per (sender, receiver); (b) each RECV's tag is its SEND's; (c) every tag in [0, top]."""
    try:
        schedule = build(name, pp, m, vp)
    except ConfigError:  # vp > 1 on a one-chunk schedule; interleaved with m not a multiple of pp
        assume(False)
    where = f"{name} pp {pp} vp {vp} m {m}"
    clash = first_collision(schedule, action_tag)
    assert clash is None, "{}: rank {} sends rank {} under tag {} both {} and {}".format(where, *clash)

    posted = {}  # Schedule.message -> (sender, receiver, tag): each message sent once
    for sender, receiver, t, message in sends(schedule):
        assert message not in posted, f"{where}: {message} sent twice"
        posted[message] = (sender, receiver, t)
    asked = receives(schedule)
    assert sorted(message for *_, message in asked) == sorted(posted), f"{where}: a message sent is not received once"
    for sender, receiver, t, message in asked:
        assert posted[message] == (sender, receiver, t), (
            f"{where}: {message} posted as {posted[message]}, "
            f"received as {(sender, receiver, t)} (sender, receiver, tag)")

    top = message_tag(BACKWARD_MESSAGE, m - 1, schedule.stages - 1, schedule.stages)  # Executor.__init__'s
    tags = [t for *_, t, _ in sends(schedule) + asked]
    assert all(0 <= t <= top for t in tags), f"{where}: tags {min(tags)}..{max(tags)} outside [0, {top}]"
    assert top <= MPI_TAG_UB_FLOOR


def test_a_wrong_formula_collides_on_interleaved_where_the_real_one_does_not():
    """``microbatch·stages + sender_stage·2 + direction`` tags micro-batch 1 leaving stage 0 like micro-batch 0
    leaving stage 2 (both 4) — and on interleaved pp 2, vp 2 rank 0 sends both to rank 1. The one-chunk schedules
    never show it: with vp = 1 a pair of ranks carries one direction from one stage, so any tag increasing in the
    micro-batch is unique there, which is why the property must draw interleaved schedules."""
    def wrong(direction, microbatch, sender_stage, stages):
        return microbatch * stages + sender_stage * 2 + direction

    interleaved = build("interleaved", pp=2, microbatches=2, vp=2)
    assert first_collision(interleaved, action_tag) is None
    assert first_collision(interleaved, formula_tag(wrong)) == (0, 1, 4, ("F", 1, 0), ("F", 0, 2))
    assert first_collision(build("1f1b", pp=4, microbatches=8), formula_tag(wrong)) is None
