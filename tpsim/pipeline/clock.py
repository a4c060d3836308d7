"""The virtual clock: a checked schedule run on modelled time, so a bubble is a number, not a wall-clock guess.

Every rank starts at 0. A compute action (F, B, W) advances its rank's clock by its cost, a function of
(rank, chunk, micro-batch) — unit costs for teaching, FLOP-derived per-stage costs for the planner. A SEND takes
no time on its sender (it is posted and never waits) and stamps the message with the sender's clock; the RECV
of it ends at ``max(own clock, stamp + α + β·bytes)`` (the α-β model of ``tpsim.cost``), its wait being idle.

    step time        the last action's end on any rank (the pipeline's makespan)
    busy_r, idle_r   rank r's compute time, and step − busy_r (waiting at receives, and after its last action)
    bubble fraction  Σ_r idle_r / (pp · step): the share of the pipeline's rank-time spent idle. This is the
                     definition under which AFAB and 1F1B give (p − 1)/(m + p − 1) with t_f, t_b uniform
                     (Narayanan et al. 2021 state it relative to the ideal time instead: (p − 1)/m; the two
                     differ only in the denominator), interleaved (p − 1)/(v·m + p − 1), ZB-H1
                     (p − 1)/(3m + p − 1) at t_F = t_B = t_W (Qi et al. 2023).
    in flight        micro-batches (per chunk) whose activations a rank holds: forwards whose backward has not
                     run — for a B/W split, whose W has not run: Qi et al. 2023 count a micro-batch's
                     activation memory as freed by W (B still leaves W's inputs held).

``unit(schedule)``: F = 1, B = 2 (split: B = 1, W = 1) for a whole stage; with v chunks a rank holds 1/v of a
stage per chunk, so each chunk's costs are divided by v; messages free. MPI-free.

``Costs.collective`` (None: collectives free, the textbook's picture) prices one collective call
``(op, group, group size, wire bytes)`` in seconds — the live clock (``tpsim.live_pipeline.clock``) charges it for every
collective traced inside a compute action, and for the collectives after the schedule; the costs here stay
per-action, so ``simulate`` knows nothing of it (the planner folds the same collectives into its per-stage
costs, ``tpsim.plan.pipeline``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from tpsim.pipeline.actions import COMPUTE, RECVS, SENDS, Schedule
from tpsim.pipeline.check import check, walk
from tpsim.pipeline.cost_rule import price

CostFn = Callable[[int, int, int], float]  # (rank, chunk, micro-batch) -> seconds
CollectiveFn = Callable[[str, str, int, int], float]  # (op, group, group size, wire bytes) -> seconds


def no_bytes(direction: str, microbatch: int, stage: int) -> float:
    return 0


@dataclass(frozen=True)
class Costs:
    """What the clock charges: ``compute[op](rank, chunk, micro-batch)`` for F, B and W; a message
    ``alpha + beta · message_bytes(direction, micro-batch, sender's virtual stage)``; a collective call
    ``collective(op, group, group size, wire bytes)`` (None: free); ``pieces(op, rank, chunk)``: the compute
    seconds of each piece of the action in execution order (``tpsim.pipeline.overlap``; None: the action's cost
    spread equally over its layers, head and embedding 0)."""

    compute: Mapping[str, CostFn]
    alpha: float = 0  # integers stay integers: integer costs give exact integer times
    beta: float = 0
    message_bytes: Callable[[str, int, int], float] = no_bytes
    collective: CollectiveFn | None = None
    pieces: Callable[[str, int, int], Sequence[float]] | None = None  # (op, rank, chunk) -> each piece's seconds


def uniform(tf: float, tb: float, tw: float = 0.0, **links) -> Costs:
    """Every F costs ``tf``, every B ``tb``, every W ``tw`` on every rank and chunk."""
    return Costs({"F": lambda *_: tf, "B": lambda *_: tb, "W": lambda *_: tw}, **links)


def unit(schedule: Schedule) -> Costs:
    """The textbook's costs: F = 1 and B = 2 a stage, split B = W = 1; each of v chunks costs 1/v; messages free."""
    v = schedule.vp
    return uniform(1 / v, 1 / v, 1 / v) if schedule.splits_backward else uniform(1 / v, 2 / v)


@dataclass(frozen=True)
class Timeline:
    """A schedule timed: ``spans[r][i]`` is the (start, end) of ``schedule.ranks[r][i]``."""

    schedule: Schedule
    spans: tuple[tuple[tuple[float, float], ...], ...]
    p2p_bytes: float  # every message once, summed over the pipeline

    @property
    def step(self) -> float:
        return max((end for spans in self.spans for _, end in spans), default=0.0)

    @property
    def busy(self) -> list[float]:
        return [sum(e - s for a, (s, e) in zip(actions, spans) if a.op in COMPUTE)
                for actions, spans in zip(self.schedule.ranks, self.spans)]

    @property
    def idle(self) -> list[float]:
        step = self.step
        return [step - busy for busy in self.busy]

    @property
    def finish(self) -> list[float]:
        """Each rank's own end: its last action's."""
        return [max((e for _, e in spans), default=0.0) for spans in self.spans]

    @property
    def bubble_fraction(self) -> float:
        """Σ idle / (pp · step)."""
        return sum(self.idle) / (self.schedule.pp * self.step) if self.step else 0.0

    @property
    def peak_in_flight(self) -> list[int]:
        return in_flight(self.schedule)


def in_flight(schedule: Schedule) -> list[int]:
    """Each rank's most (micro-batch, chunk) pairs held at once: F run, its B (split: its W) not yet."""
    release = "W" if schedule.splits_backward else "B"
    peaks = []
    for actions in schedule.ranks:
        held = peak = 0
        for a in actions:
            held += (a.op == "F") - (a.op == release)
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


def simulate(schedule: Schedule, costs: Costs | None = None) -> Timeline:
    """Check ``schedule``, then time it under ``costs`` (default ``unit(schedule)``): every action one node of the
    one cost rule (``tpsim.pipeline.cost_rule.price``) in an order the lists can run in (``walk``) — a compute
    action its cost, a SEND 0 (it never waits), a RECV 0 after its SEND plus α + β·bytes, a collective of data
    parallelism 0 (it runs on the comm stream, ``tpsim.pipeline.collectives``). A receive's span starts where
    its rank's clock stood before it, so its length is the wait."""
    costs = unit(schedule) if costs is None else costs
    check(schedule)
    order = list(walk(schedule))
    rank, dep, hop, cost = [], [], [], []
    sends: dict[tuple[str, int, int], int] = {}
    sent: float = 0
    for n, (r, _, a) in enumerate(order):
        d, h, c = -1, 0, 0
        if a.op in COMPUTE:
            c = costs.compute[a.op](r, a.chunk, a.microbatch)
        elif a.op in SENDS:
            key = schedule.message(r, a)
            sends[key] = n
            sent += costs.message_bytes(*key)
        elif a.op in RECVS:
            key = schedule.message(r, a)
            d, h = sends[key], costs.alpha + costs.beta * costs.message_bytes(*key)
        rank.append(r)
        dep.append(d)
        hop.append(h)
        cost.append(c)
    timed = price(rank, dep, hop, cost, schedule.pp)
    spans: list[list[tuple[float, float]]] = [[(0, 0)] * len(a) for a in schedule.ranks]
    before = [0] * schedule.pp
    for (r, i, a), start, end in zip(order, timed.starts, timed.ends):
        spans[r][i] = (before[r] if a.op in RECVS else start, end)
        before[r] = end
    return Timeline(schedule, tuple(map(tuple, spans)), sent)
