"""The one cost rule of the virtual clocks: when an action of a step starts, and when it ends.

    start = max(its rank's clock, ready)     ready = the end of the action it waits for + the hop between them
    end   = start + its cost                 and the rank's clock moves to end

A hop is what lies between two ranks' actions: a message's α + β·bytes (``tpsim.cost``). An action that waits
for nothing is ready at once. Every clock of tpsim times a step by this rule and by no copy of it:

    the unit clock            ``tpsim.pipeline.clock.simulate``: each action of a ``Schedule`` one node; a SEND
                              costs 0, a RECV waits for its SEND plus the hop and costs 0
    the planner's clock       ``tpsim.pipeline.stage_clock.timed``: the compute actions only, a RECV folded into
                              the F or B after it, a SEND into the one before (the schedules place them so)
    the live clock            ``tpsim.live_pipeline.clock.LiveClock``: each action as it runs on its rank, a message's
                              ready time its sender's stamp plus the hop

``price`` runs a numbered list of such nodes (an order they can run in: a node after the one it waits for).
A node whose length is not one number — a forward that waits piece by piece for its parameters' all-gathers
(``tpsim.plan.param_gather``) — is given as a function of its start that returns its end. Integer costs give
integer times (the textbook's unit clock stays exact). The streams beside the compute (the DP buckets, ZeRO's
gathers and reduce-scatters) have their own rules, each one function too: ``tpsim.pipeline.overlap``,
``tpsim.pipeline.prefetch``. MPI-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence


def begin(clock: float, ready: float) -> float:
    """An action's start: its rank is free at ``clock``, what it waits for is there at ``ready``."""
    return ready if ready > clock else clock


def arrival(sent: float, hop: float) -> float:
    """When what was sent (or finished) at ``sent`` can be used across a hop of ``hop`` seconds."""
    return sent + hop


@dataclass(frozen=True)
class Priced:
    """A list of nodes timed: each node's ``starts`` and ``ends``, each rank's ``clocks`` after its last node."""

    starts: list
    ends: list
    clocks: list


def price(rank: Sequence[int], dep: Sequence[int], hop: Sequence[float], cost: Sequence[float], ranks: int,
          start: Sequence[float] | None = None,
          runs: Mapping[int, Callable[[float], float]] | None = None) -> Priced:
    """Time nodes ``0 .. n−1`` in that order by the rule (module docstring): node k runs on ``rank[k]`` for
    ``cost[k]``, waiting for node ``dep[k]`` (−1: none) plus ``hop[k]``; rank r's clock starts at ``start[r]``
    (default 0). ``runs[k]``, where given, replaces node k's cost: its end as a function of its start."""
    clock = [0] * ranks if start is None else list(start)
    starts: list = []
    ends: list = []
    add_start, add_end = starts.append, ends.append
    for k, r in enumerate(rank):  # begin() and arrival() written out: this loop runs a million nodes a search
        t = clock[r]
        d = dep[k]
        if d >= 0:
            ready = ends[d] + hop[k]
            if ready > t:
                t = ready
        add_start(t)
        run = None if runs is None else runs.get(k)
        t = t + cost[k] if run is None else run(t)
        add_end(t)
        clock[r] = t
    return Priced(starts, ends, clock)
