"""The schedule checker: a bad schedule is a one-line ``ConfigError`` before anything runs, never a hang.

``check(schedule)`` passes only if, under the semantics of ``tpsim.pipeline.actions`` (a SEND is posted and never
waits, a RECV waits for its message):

1. every action names a micro-batch and chunk that exist, and every send or receive the right peer for the
   virtual-stage layout (virtual stage s sends activations to s + 1, gradients to s − 1, on rank (s ± 1) mod pp);
2. every SEND has exactly one RECV of the same message (direction, micro-batch, sender's virtual stage) on its
   peer, and every RECV exactly one SEND;
3. every (micro-batch, virtual stage) has exactly one F and one B — and one W if the schedule splits backward —
   with the messages around them (RECV_F, SEND_F, RECV_B, SEND_B, except at the ends of the model), in a legal
   order on its rank: RECV_F < F < SEND_F, RECV_B < B < SEND_B, F < B < W;
4. running the lists cannot deadlock: ``walk`` runs them (sends post at once, a RECV blocks until its message is
   posted); if every unfinished rank is blocked, the error names the cycle of ranks waiting on each other;
5. data parallelism's collectives, where the lists carry them, sit on the compute they serve
   (``tpsim.pipeline.collectives.check_collectives``): an UNSHARD right before an F or B of its (micro-batch,
   chunk), a RESHARD and a REDUCE_GRAD right after one (the REDUCE_GRAD after the backward that finishes the
   gradients: B, or W when split), at most one of each kind on one compute action.

The same ``walk`` drives the virtual clock (``tpsim.pipeline.clock``), so what is checked is what is timed.
MPI-free.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterator

from tpsim.errors import ConfigError
from tpsim.pipeline.actions import COLLECTIVES, LOCAL, RECVS, SENDS, Action, Schedule
from tpsim.pipeline.collectives import check_collectives


def where(schedule: Schedule, rank: int, index: int) -> str:
    return f"{schedule.name}: rank {rank}, action {index} ({schedule.ranks[rank][index]})"


def expected_peer(schedule: Schedule, rank: int, action: Action) -> int | None:
    """The rank a send or receive must name; None where the model has no neighbour that way."""
    stage = schedule.virtual_stage(rank, action.chunk)
    other = stage + 1 if action.op in ("SEND_F", "RECV_B") else stage - 1
    return other % schedule.pp if 0 <= other < schedule.stages else None


def check_fields(schedule: Schedule) -> None:
    """Ranks, micro-batches, chunks and peers that exist (rule 1)."""
    if len(schedule.ranks) != schedule.pp:
        raise ConfigError(f"{schedule.name}: {len(schedule.ranks)} action lists for --pp {schedule.pp}")
    for rank, actions in enumerate(schedule.ranks):
        for i, a in enumerate(actions):
            if not 0 <= a.microbatch < schedule.microbatches:
                raise ConfigError(f"{where(schedule, rank, i)}: micro-batch {a.microbatch} is not in "
                                  f"0..{schedule.microbatches - 1}")
            if not 0 <= a.chunk < schedule.vp:
                raise ConfigError(f"{where(schedule, rank, i)}: chunk {a.chunk} is not in 0..{schedule.vp - 1}")
            if a.op in LOCAL:
                continue
            peer = expected_peer(schedule, rank, a)
            stage = schedule.virtual_stage(rank, a.chunk)
            if peer is None:
                raise ConfigError(f"{where(schedule, rank, i)}: virtual stage {stage} has no neighbour to "
                                  f"{'send to' if a.op in SENDS else 'receive from'} that way")
            if a.peer != peer:
                raise ConfigError(f"{where(schedule, rank, i)}: wrong peer {a.peer}, virtual stage {stage}'s "
                                  f"neighbour that way is on rank {peer}")


def check_messages(schedule: Schedule) -> None:
    """Every SEND has exactly one RECV on its peer and every RECV one SEND (rule 2)."""
    posts: dict[str, dict[tuple, tuple[int, int]]] = {"send": {}, "recv": {}}
    for rank, actions in enumerate(schedule.ranks):
        for i, a in enumerate(actions):
            if a.op in LOCAL:
                continue
            side = posts["send" if a.op in SENDS else "recv"]
            key = schedule.message(rank, a)
            if key in side:
                raise ConfigError(f"{where(schedule, rank, i)}: a second {a.op} of the same message "
                                  f"(the first is action {side[key][1]})")
            side[key] = (rank, i)
    for side, other, missing in (("send", "recv", "RECV"), ("recv", "send", "SEND")):
        for key, (rank, i) in posts[side].items():
            if key not in posts[other]:
                a = schedule.ranks[rank][i]
                raise ConfigError(f"{where(schedule, rank, i)}: rank {a.peer} has no matching "
                                  f"{missing}_{key[0]}{key[1]} (virtual stage {key[2]}'s message)")


def required(schedule: Schedule, stage: int) -> tuple[str, ...]:
    """The actions every micro-batch needs on virtual stage ``stage``, in the order they must come."""
    first, last = stage == 0, stage == schedule.stages - 1
    return tuple(op for op, needed in (("RECV_F", not first), ("F", True), ("SEND_F", not last),
                                       ("RECV_B", not last), ("B", True), ("SEND_B", not first),
                                       ("W", schedule.splits_backward)) if needed)


BEFORE = (("RECV_F", "F"), ("F", "SEND_F"), ("RECV_B", "B"), ("B", "SEND_B"), ("F", "B"), ("B", "W"))


def check_work(schedule: Schedule) -> None:
    """Every (micro-batch, virtual stage) has each action it needs once, in a legal order on its rank (rule 3)."""
    for rank, actions in enumerate(schedule.ranks):
        counts = Counter((a.op, a.microbatch, a.chunk) for a in actions if a.op not in COLLECTIVES)
        position = {(a.op, a.microbatch, a.chunk): i for i, a in enumerate(actions) if a.op not in COLLECTIVES}
        for i, a in enumerate(actions):
            if a.op in COLLECTIVES:
                continue
            if counts[(a.op, a.microbatch, a.chunk)] > 1:
                raise ConfigError(f"{where(schedule, rank, i)}: {a.op} of micro-batch {a.microbatch}, chunk "
                                  f"{a.chunk} appears {counts[(a.op, a.microbatch, a.chunk)]} times")
            if a.op == "W" and not schedule.splits_backward:
                raise ConfigError(f"{where(schedule, rank, i)}: W in a schedule that does not split backward")
        for c in range(schedule.vp):
            stage = schedule.virtual_stage(rank, c)
            needs = required(schedule, stage)
            for j in range(schedule.microbatches):
                for op in needs:
                    if (op, j, c) not in position:
                        raise ConfigError(f"{schedule.name}: rank {rank} never runs {op} of micro-batch {j} on "
                                          f"chunk {c} (virtual stage {stage})")
                for early, late in BEFORE:
                    if early in needs and late in needs and position[(early, j, c)] > position[(late, j, c)]:
                        i = position[(late, j, c)]
                        raise ConfigError(f"{where(schedule, rank, i)}: comes before {early} of micro-batch "
                                          f"{j} (action {position[(early, j, c)]}), which it needs first")


def walk(schedule: Schedule) -> Iterator[tuple[int, int, Action]]:
    """Run the lists under the semantics: yield ``(rank, index, action)`` in an order they can happen in (every
    SEND before its RECV); ``ConfigError`` naming the cycle if every unfinished rank waits on a RECV."""
    posted: set[tuple[str, int, int]] = set()
    pos = [0] * schedule.pp
    moved = True
    while moved:
        moved = False
        for rank, actions in enumerate(schedule.ranks):
            while pos[rank] < len(actions):
                a = actions[pos[rank]]
                key = None if a.op in LOCAL else schedule.message(rank, a)
                if a.op in RECVS and key not in posted:
                    break
                if a.op in SENDS:
                    posted.add(key)
                yield rank, pos[rank], a
                pos[rank] += 1
                moved = True
    if any(pos[r] < len(schedule.ranks[r]) for r in range(schedule.pp)):
        raise ConfigError(deadlock(schedule, pos))


def deadlock(schedule: Schedule, pos: list[int]) -> str:
    """One line: the ranks that wait on each other, in a cycle, from the lowest blocked rank."""
    rank = min(r for r in range(schedule.pp) if pos[r] < len(schedule.ranks[r]))
    seen: list[int] = []
    while rank not in seen and pos[rank] < len(schedule.ranks[rank]):
        seen.append(rank)
        rank = schedule.ranks[rank][pos[rank]].peer
    if rank not in seen:  # the sender finished without sending: rule 2 reports that before we get here
        return f"{schedule.name}: deadlock: rank {seen[-1]} waits for a message rank {rank} never sends"
    cycle = seen[seen.index(rank):]
    waits = "; ".join(f"rank {r} waits at action {pos[r]} ({schedule.ranks[r][pos[r]]}) for rank "
                      f"{schedule.ranks[r][pos[r]].peer}" for r in cycle)
    return f"{schedule.name}: deadlock, a cycle: {waits}"


def check(schedule: Schedule) -> Schedule:
    """``schedule`` if it can run (the five rules above), else ``ConfigError`` naming the rank, the action and
    the problem in one line."""
    check_fields(schedule)
    check_messages(schedule)
    check_work(schedule)
    check_collectives(schedule)
    for _ in walk(schedule):
        pass
    return schedule
