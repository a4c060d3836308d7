"""Data parallelism's collectives as schedule actions, placed by one pass over a schedule's lists.

A pipeline rank's list says when it computes and when it talks to its pipeline neighbours; what it does with
the other replicas of its stage — gather parameters, free them, reduce gradients — is data parallelism's, and
ZeRO's stage (``tpsim.zero_stage``) says when. ``around`` is that rule for one compute action, and
``with_collectives`` applies it to every compute action of a schedule, as PyTorch's pipelining inserts its
``UNSHARD`` / ``RESHARD`` / ``REDUCE_GRAD`` actions (``_add_unshard_reshard``, ``_add_reduce_grad``) and the Zero
Bubble repository's passes insert communication into compute orders:

    UNSHARD j.c       right before the F or B of micro-batch j on chunk c that needs the chunk's parameters
                      whole: ZeRO-3 before every F and every B (each unit all-gathered as the action reaches it,
                      prefetched one ahead: ``tpsim.pipeline.prefetch``); ZeRO-1/2 before micro-batch 0's F,
                      the first read of the parameters the last optimizer step's all-gathers updated (where
                      ``--overlap-param-gather`` waits: ``tpsim.pipeline.overlap.forward_gates``)
    RESHARD j.c       ZeRO-3, right after that F or B: the gathered parameters freed
    REDUCE_GRAD j.c   right after the backward that finishes micro-batch j's gradients on chunk c (B, or W when
                      the backward is split): every micro-batch's when the stage reduces in every backward
                      (ZeRO-2/3: each bucket reduce-scattered into the owned slices as it is finished), only the
                      last micro-batch's when it reduces once a step (DP's all-reduce, ZeRO-1's reduce-scatter:
                      issued bucket by bucket during that backward under ``--overlap-grad-reduce``, after the
                      schedule without it)

A W needs no parameters (dW = xᵀ·dy), so it is
never unsharded. The live executor runs what the lists say (``tpsim.live_pipeline.executor``: a REDUCE_GRAD arms the
gradient sync for the backward before it; an UNSHARD marks the forward the all-gathers gate, or the action whose
gathers are prefetched), the clocks price them (``tpsim.live_pipeline.clock``; on the unit clock they take no time: the
collectives run on the comm stream), ``tpsim schedule --zero`` prints them and the planner counts a step's
collectives from the same rule (``per_chunk``). MPI-free.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

from tpsim.errors import ConfigError
from tpsim.pipeline.actions import COLLECTIVES, COMPUTE, Action, Schedule
from tpsim.zero_stage import ZeroStage


def around(op: str, microbatch: int, stage: ZeroStage, microbatches: int, split: bool) -> tuple[tuple, tuple]:
    """The collectives before and after compute action ``op`` of ``microbatch`` (module docstring's rule):
    ``(before, after)``, each a tuple of op names in the order they run."""
    before, after = [], []
    if op in ("F", "B") and stage.gathers_around_units:
        before.append("UNSHARD")
        after.append("RESHARD")
    elif op == "F" and microbatch == 0 and stage.gathers_after_step:
        before.append("UNSHARD")
    if op == ("W" if split else "B") and (stage.reduces_every_microbatch or microbatch == microbatches - 1):
        after.append("REDUCE_GRAD")
    return tuple(before), tuple(after)


def with_collectives(schedule: Schedule, stage: ZeroStage) -> Schedule:
    """``schedule`` with the collectives of ZeRO stage ``stage`` placed on its compute actions; a schedule that
    carries some already is refused. A gradient group of one rank gets them too: its reductions are a copy, but
    ZeRO-2/3 still move each bucket into the owned slices when they say so."""
    if schedule.has_collectives:
        raise ConfigError(f"{schedule.name}: its lists carry collectives already")
    m, split = schedule.microbatches, schedule.splits_backward
    ranks = []
    for actions in schedule.ranks:
        out: list[Action] = []
        for a in actions:
            if a.op not in COMPUTE:
                out.append(a)
                continue
            before, after = around(a.op, a.microbatch, stage, m, split)
            out += [Action(op, a.microbatch, a.chunk) for op in before]
            out.append(a)
            out += [Action(op, a.microbatch, a.chunk) for op in after]
        ranks.append(tuple(out))
    return Schedule(schedule.name, schedule.pp, m, schedule.vp, tuple(ranks))


def without_collectives(schedule: Schedule) -> Schedule:
    """The compute and the messages only."""
    ranks = tuple(tuple(a for a in actions if a.op not in COLLECTIVES) for actions in schedule.ranks)
    return Schedule(schedule.name, schedule.pp, schedule.microbatches, schedule.vp, ranks)


def per_chunk(stage: ZeroStage, microbatches: int, split: bool) -> Counter:
    """How many of each collective one chunk runs a step: ``around`` summed over its compute actions (every
    micro-batch's F and B, and W when split)."""
    return Counter(dict(_per_chunk(stage, microbatches, split)))


@lru_cache(maxsize=256)
def _per_chunk(stage: ZeroStage, microbatches: int, split: bool) -> tuple[tuple[str, int], ...]:
    out: Counter = Counter()
    for j in range(microbatches):
        for op in ("F", "B", "W") if split else ("F", "B"):
            before, after = around(op, j, stage, microbatches, split)
            out.update(before + after)
    return tuple(out.items())


ATTACHED = {"UNSHARD": (1, ("F", "B")), "RESHARD": (-1, ("F", "B"))}  # direction to its compute, which ops


def served(schedule: Schedule, rank: int, i: int) -> Action | None:
    """The compute action collective ``i`` of ``rank`` sits on: the next one for an UNSHARD, the previous one
    for a RESHARD or REDUCE_GRAD, across other collectives only (None if a message or nothing is there)."""
    actions = schedule.ranks[rank]
    step = ATTACHED.get(actions[i].op, (-1,))[0]
    k = i + step
    while 0 <= k < len(actions) and actions[k].op in COLLECTIVES:
        k += step
    return actions[k] if 0 <= k < len(actions) and actions[k].op in COMPUTE else None


def check_collectives(schedule: Schedule) -> None:
    """Each collective on a compute action of its (micro-batch, chunk) that it can serve (module docstring), at
    most one of a kind on one compute action; ``ConfigError`` naming the rank and the action otherwise."""
    if not schedule.has_collectives:
        return
    grads = "W" if schedule.splits_backward else "B"
    for rank, actions in enumerate(schedule.ranks):
        seen: set[tuple] = set()
        for i, a in enumerate(actions):
            if a.op not in COLLECTIVES:
                continue
            host = served(schedule, rank, i)
            ops = ATTACHED.get(a.op, (-1, (grads,)))[1]
            side = "before" if a.op == "UNSHARD" else "after"
            if host is None or host.op not in ops or (host.microbatch, host.chunk) != (a.microbatch, a.chunk):
                raise ConfigError(f"{schedule.name}: rank {rank}, action {i} ({a}): not right {side} "
                                  f"{' or '.join(f'{op}{a.microbatch}' for op in ops)} of chunk {a.chunk}, the "
                                  "compute it serves")
            if (a.op, host) in seen:
                raise ConfigError(f"{schedule.name}: rank {rank}, action {i} ({a}): a second {a.op} on {host}")
            seen.add((a.op, host))
